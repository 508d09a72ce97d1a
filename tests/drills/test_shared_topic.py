"""Two root tables on one topic get the same cut at every barrier: ``orders_raw`` appends every
record of ``kafka:orders``, ``orders_latest`` upserts the same records by key. Orders are sent in
rounds (new orders and changes of earlier ones) while both jobs run; at every barrier that is an
exact point of both, ``orders_latest`` must hold exactly the newest record of every order that
``orders_raw`` holds, and both jobs must have read up to the same offsets."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from spark_jobs.runtime.delta_log import read_version
from tests.support.barriers import read_state, wait_for_barrier

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PIPELINE = """
CREATE TABLE orders_raw (oid BIGINT, amount BIGINT, seq BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE orders_latest (oid BIGINT, amount BIGINT, seq BIGINT)
  WITH ('source' = 'kafka:{topic}', 'format' = 'json', 'primary_key' = 'oid');
"""
Row = tuple[int, int, int]


@pytest.mark.barrier_interval_ms(500)  # fewer barriers to compare, each with more in it
def test_two_root_tables_on_one_topic_hold_the_same_records_at_every_barrier(
    spark: SparkSession, run_pipeline: Callable[[str], Settings], make_topic: Callable, kafka_bootstrap: str,
) -> None:
    topic = make_topic(partitions=2)
    settings = run_pipeline(PIPELINE.format(topic=topic))
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 2})
    rng, seq, ends = random.Random(29), 0, {0: 0, 1: 0}

    def delivered(err: object, msg: object) -> None:
        assert err is None, err
        ends[msg.partition()] = max(ends[msg.partition()], msg.offset() + 1)  # type: ignore[attr-defined]

    wait_for_barrier(settings, ["orders_raw", "orders_latest"], ends, topic, timeout=180)  # both jobs are up
    for _ in range(12):  # rounds a few barriers apart: new orders, and changes of earlier ones
        for _ in range(rng.randrange(20, 60)):
            seq += 1
            oid = rng.randrange(seq) if rng.random() < 0.3 else 10_000 + seq
            producer.produce(topic, key=str(oid).encode(), value=json.dumps({"oid": oid, "amount": rng.randrange(100),
                                                                              "seq": seq}).encode(), on_delivery=delivered)
        producer.flush(10)
        time.sleep(rng.uniform(0.1, 0.8))
    wait_for_barrier(settings, ["orders_raw", "orders_latest"], ends, topic, timeout=180)

    state = read_state(settings)
    raw_points, latest_points = state.exact_points("orders_raw"), state.exact_points("orders_latest")
    common = sorted(set(raw_points) & set(latest_points))
    assert len(common) >= 5, f"too few common exact points to compare: {common}"
    seen_sizes = set()
    for b in common:
        ranges = {name: {(r.partition): r.end for r in state.completions[name][b].source_offsets}
                  for name in ("orders_raw", "orders_latest")}
        assert ranges["orders_raw"] == ranges["orders_latest"], f"barrier {b}: the jobs read to different offsets"
        raw: list[Row] = [tuple(r) for r in read_version(spark, settings.table_location("orders_raw"), raw_points[b])
                          .select("oid", "amount", "seq").collect()]
        latest = {tuple(r) for r in read_version(spark, settings.table_location("orders_latest"), latest_points[b])
                  .select("oid", "amount", "seq").collect()}
        newest: dict[int, Row] = {}
        for row in raw:
            if row[0] not in newest or row[2] > newest[row[0]][2]:
                newest[row[0]] = row
        assert latest == set(newest.values()), f"barrier {b}: orders_latest is not the newest of orders_raw's records"
        seen_sizes.add(len(raw))
    assert len(seen_sizes) >= 3, "the compared barriers should hold different amounts of data"
    assert max(seen_sizes) == seq  # the last compared barrier holds every order sent
