"""Root ingestion and a derived table, barrier by barrier, against a real worker, Kafka and Delta.

The oracle is plain Python over the records the test produced, cut where the barrier's cut says.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from tests.support.barriers import at, wait_for_barrier

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PIPELINE = """
CREATE TABLE shopping (user_id BIGINT, item_id BIGINT, amount BIGINT, price DOUBLE)
  WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE user_item_amount AS
  SELECT user_id, item_id, SUM(amount) AS total_amount FROM shopping GROUP BY user_id, item_id;
"""


def test_root_json_ingestion_with_dead_letters_and_a_derived_table(
    spark: SparkSession, run_pipeline: Callable[[str], Settings], make_topic: Callable, kafka_bootstrap: str
) -> None:
    topic = make_topic(partitions=2)
    settings = run_pipeline(PIPELINE.format(topic=topic))
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    sent: list[tuple[int, int, bytes]] = []  # (partition, offset, value)
    bad_values = [b"{not json", b'{"user_id": 1, "item_id": 2, "amount": "lots", "price": 1.0}', b"[1, 2]"]

    def send(values: list[bytes], only: int | None = None) -> dict[int, int]:
        for i, value in enumerate(values):
            producer.produce(topic, value=value, partition=i % 2 if only is None else only,
                             on_delivery=lambda err, msg: sent.append((msg.partition(), msg.offset(), msg.value())))
        producer.flush(10)
        ends: dict[int, int] = defaultdict(int)
        for p, off, _ in sent:
            ends[p] = max(ends[p], off + 1)
        return dict(ends)

    good = [json.dumps({"user_id": i % 3, "item_id": i % 2, "amount": i, "price": 0.5}).encode() for i in range(40)]
    for round_number in (1, 2):  # round 2 sends after round 1 is in, and partition 0 gets nothing new
        round_ends = send(good[:20] + bad_values) if round_number == 1 else send(good[20:], only=1)
        state, b = wait_for_barrier(settings, ["shopping", "user_item_amount"], round_ends, topic)
        cut = {c.partition: c.offset for c in state.barriers[b].cut}
        upto = [json.loads(v) for p, off, v in sent if off < cut.get(p, 0) and v not in bad_values]
        expected_sum: dict[tuple[int, int], int] = defaultdict(int)
        for r in upto:
            expected_sum[(r["user_id"], r["item_id"])] += r["amount"]

        versions = {t: state.exact_points(t)[b] for t in ("shopping", "user_item_amount")}
        assert at(spark, settings, "shopping", versions["shopping"]).count() == len(upto)
        amounts = at(spark, settings, "user_item_amount", versions["user_item_amount"])
        assert {(r["user_id"], r["item_id"]): r["total_amount"] for r in amounts.collect()} == dict(expected_sum)

    dlq = spark.read.format("delta").load(settings.table_location("shopping__dlq")).collect()
    reasons = sorted(r["error"] for r in dlq)
    assert len(dlq) == 3
    assert any(r.startswith("malformed JSON") for r in reasons)
    assert "column amount: expected BIGINT, got str \"lots\"" in reasons
    assert "expected a JSON object, got list" in reasons
    completions = state.completions["shopping"].values()
    assert sum(c.rows_in for c in completions) == len(sent)
    assert sum(c.rows_out for c in completions) + sum(c.rows_rejected for c in completions) == len(sent)


def test_primary_key_table_upserts_with_the_last_change_per_key_winning(
    spark: SparkSession, run_pipeline: Callable[[str], Settings], make_topic: Callable, kafka_bootstrap: str
) -> None:
    topic = make_topic(partitions=1)
    settings = run_pipeline(
        f"CREATE TABLE accounts (id BIGINT, balance BIGINT) "
        f"WITH ('source' = 'kafka:{topic}', 'format' = 'json', 'primary_key' = 'id')"
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    expected: dict[int, int] = {}
    for step in range(30):  # each id is written several times inside one barrier
        record = {"id": step % 4, "balance": step}
        expected[record["id"]] = record["balance"]
        producer.produce(topic, key=str(record["id"]).encode(), value=json.dumps(record).encode())
    producer.produce(topic, value=json.dumps({"id": None, "balance": 1}).encode())
    producer.flush(10)
    state, b = wait_for_barrier(settings, ["accounts"], {0: 31}, topic)
    rows = at(spark, settings, "accounts", state.exact_points("accounts")[b]).collect()
    assert {r["id"]: r["balance"] for r in rows} == expected
    assert len(rows) == 4
    dlq = spark.read.format("delta").load(settings.table_location("accounts__dlq")).collect()
    assert [r["error"] for r in dlq] == ["primary key column id is missing or null"]


def test_aborted_transactions_are_never_ingested(
    spark: SparkSession, run_pipeline: Callable[[str], Settings], make_topic: Callable, kafka_bootstrap: str
) -> None:
    topic = make_topic(partitions=1)
    settings = run_pipeline(PIPELINE.format(topic=topic))
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{topic}-writer"})
    producer.init_transactions(30)
    row = lambda amount: json.dumps({"user_id": 1, "item_id": 1, "amount": amount, "price": 1.0}).encode()  # noqa: E731
    for amount, commit in ((1, True), (100, False), (10, True), (1000, False)):  # two batches aborted
        producer.begin_transaction()
        for _ in range(3):
            producer.produce(topic, value=row(amount))
        # in the log before the transaction ends: an abort purges records still in flight, and
        # then there would be nothing aborted for the ingest to skip
        assert producer.flush(30) == 0
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    high = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"{topic}-probe"})
    _, end = high.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    high.close()
    state, b = wait_for_barrier(settings, ["shopping", "user_item_amount"], {0: end}, topic)
    rows = at(spark, settings, "shopping", state.exact_points("shopping")[b]).collect()
    assert sorted(r["amount"] for r in rows) == [1, 1, 1, 10, 10, 10]  # what was committed, once each
    totals = at(spark, settings, "user_item_amount", state.exact_points("user_item_amount")[b]).collect()
    assert [r["total_amount"] for r in totals] == [33]
