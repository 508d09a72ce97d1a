"""Transaction alignment with Spark over real topics, Debezium's JSON written by the test so every
awkward order is there on purpose: a transaction's END below the cut while one table's events
lie past it, a transaction that has not ended, a snapshot, a tombstone, a restart."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from coordinator.domain.events import OffsetRange
from coordinator.domain.work import EARLIEST, BarrierWork
from coordinator.settings import Settings
from spark_jobs.planning.pipeline import RootTable, parse_pipeline
from spark_jobs.runtime.kafka_ranges import kafka_source_options
from spark_jobs.runtime.source_transactions import TransactionAlignment

pytestmark = [pytest.mark.integration]


def change(op: str, row_id: int, tx: int | None, envelope: bool) -> bytes:
    """A Debezium change event as the JSON converter writes it (``envelope``: schemas on)."""
    event: dict[str, Any] = {"before": None, "after": {"id": row_id}, "op": op,
                             "transaction": None if tx is None else {"id": f"{tx}:{1000 + row_id}", "total_order": 1}}
    return json.dumps({"schema": {"type": "struct"}, "payload": event} if envelope else event).encode()


def marker(status: str, tx: int, counts: dict[str, int] | None = None) -> bytes:
    collections = None if counts is None else [{"data_collection": c, "event_count": n} for c, n in counts.items()]
    return json.dumps({"schema": {"type": "struct"}, "payload": {
        "status": status, "id": f"{tx}:{5000 + tx}", "event_count": None if counts is None else sum(counts.values()),
        "data_collections": collections}}).encode()


def tables(a: str, b: str, tx_topic: str) -> tuple[RootTable, RootTable]:
    options = f"'format' = 'debezium-json', 'primary_key' = 'id', 'transactions' = 'kafka:{tx_topic}'"
    pipeline = parse_pipeline(f"CREATE TABLE a (id BIGINT) WITH ('source' = 'kafka:{a}', {options});\n"
                              f"CREATE TABLE b (id BIGINT) WITH ('source' = 'kafka:{b}', {options});")
    first, second = pipeline.roots
    return first, second


def test_each_table_ends_its_barrier_after_whole_ended_transactions_reading_past_its_cut_when_needed(
    spark: SparkSession, make_topic: Callable[..., str], kafka_bootstrap: str, base_settings: Settings
) -> None:
    a, b, tx_topic = make_topic(prefix="src.public.a"), make_topic(prefix="src.public.b"), make_topic(prefix="src.tx")
    table_a, table_b = tables(a, b, tx_topic)
    ca, cb = table_a.collection, table_b.collection
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    records = {
        a: [change("r", 1, None, True), change("c", 2, 10, True), change("c", 3, 10, True), change("u", 1, 11, True),
            change("d", 2, 11, True), None, change("c", 4, 12, True)],  # offset 5: the delete's tombstone
        b: [change("c", 1, 10, False), change("c", 2, 11, False), change("c", 3, 11, False), change("c", 4, 12, False)],
        tx_topic: [marker("BEGIN", 10), marker("END", 10, {ca: 2, cb: 1}), marker("BEGIN", 11),
                   marker("END", 11, {ca: 2, cb: 2}), marker("BEGIN", 12)],
    }
    for topic, values in records.items():
        for value in values:
            producer.produce(topic, key=b'{"id": 1}', value=value, partition=0)
    producer.flush(10)
    options = kafka_source_options(dataclasses.replace(base_settings, bootstrap=kafka_bootstrap))

    def work(barrier: int, cuts: dict[str, tuple[int, int]]) -> BarrierWork:
        return BarrierWork(barrier, 0, 0, [OffsetRange(t, 0, start, end) for t, (start, end) in cuts.items()])

    def ends(alignment: TransactionAlignment, barrier: BarrierWork) -> dict[str, tuple[int, int]]:
        ranges = alignment.align(barrier, {})
        alignment.committed(barrier, ranges)
        return {r.topic: (r.start, r.end) for r in ranges}

    align_a, align_b = (TransactionAlignment(spark, t, options) for t in (table_a, table_b))
    # barrier 0: cut before b's topic was measured (another table's job registered first): b takes
    # neither events nor ENDs, which stay for its next barrier
    early = {tx_topic: (EARLIEST, 2)}
    assert ends(align_b, work(0, early)) == {tx_topic: (EARLIEST, EARLIEST)}
    # barrier 1: END 10 is in; a's records end with the first of 11 (not ended), b's one event of
    # 10 lies past b's cut (its topic lagged the markers): b reads on to it
    first = {tx_topic: (EARLIEST, 2)}
    assert ends(align_a, work(1, {a: (EARLIEST, 4), **first})) == {a: (EARLIEST, 3), **first}
    assert ends(align_b, work(1, {b: (EARLIEST, 0), **first})) == {b: (EARLIEST, 1), **first}
    # barrier 2 (the barrier's own starts are the cuts: each job goes on where it really ended):
    # END 11 is in; a takes 11 with its tombstone and stops at 12; b reads past its cut for 11's last event
    second = {tx_topic: (2, 5)}
    assert ends(align_a, work(2, {a: (4, 7), **second})) == {a: (3, 6), **second}
    assert ends(align_b, work(2, {b: (0, 2), **second})) == {b: (1, 3), **second}
    # barrier 3 after a restart: a fresh job starts where the completions said; 12 has not ended
    third = {tx_topic: (5, 5)}
    restarted = TransactionAlignment(spark, table_a, options)
    assert ends(restarted, work(3, {a: (6, 7), **third})) == {a: (6, 6), **third}
    assert ends(TransactionAlignment(spark, table_b, options), work(3, {b: (3, 4), **third})) == {b: (3, 3), **third}
