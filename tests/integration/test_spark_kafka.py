"""Spark's Kafka source reads exactly a given offset range (what a barrier epoch needs)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration]


def test_exact_offset_range_returns_exactly_those_records(
    spark: SparkSession, kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(partitions=3)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(300):
        producer.produce(topic, partition=i % 3, value=json.dumps({"i": i}).encode())
    assert producer.flush(10) == 0
    # Each partition holds 100 records at offsets 0..99; the record with i sits at offset i // 3.
    start = {"0": 10, "1": 0, "2": 99}
    end = {"0": 25, "1": 1, "2": 100}  # end offsets are exclusive

    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps({topic: start}))
        .option("endingOffsets", json.dumps({topic: end}))
        .load()
        .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
        .collect()
    )
    got = sorted((r["partition"], r["offset"], json.loads(r["value"])["i"]) for r in rows)
    expected = sorted(
        (p, off, off * 3 + p) for p in range(3) for off in range(start[str(p)], end[str(p)])
    )
    assert got == expected
    assert len(got) == 15 + 1 + 1
