"""A compacted topic keeps the latest value per key and the delete marker (real broker)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMPACT_FAST = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "600000",
}


def test_compacted_topic_keeps_latest_value_per_key_and_tombstone(
    kafka_bootstrap: str, make_topic: Callable[..., str], read_topic: Callable[[str], list]
) -> None:
    topic = make_topic(config=COMPACT_FAST, prefix="compacted")
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    keys = [f"k{i}".encode() for i in range(10)]
    for version in range(5):
        for key in keys:
            producer.produce(topic, key=key, value=f"{key.decode()}=v{version}".encode())
        producer.flush(10)
    producer.produce(topic, key=b"k3", value=None)  # tombstone
    producer.flush(10)
    written = 5 * len(keys) + 1

    # The active segment is never cleaned: keep appending a marker so older segments roll.
    deadline = time.monotonic() + 60
    while True:
        time.sleep(0.5)
        producer.produce(topic, key=b"roll", value=b"x")
        producer.flush(10)
        records = [r for r in read_topic(topic) if r[2] != b"roll"]
        if len(records) < written or time.monotonic() > deadline:
            break

    assert len(records) == len(keys), f"compaction did not run: {len(records)} records of {written} remain"
    latest = {key: value for _, _, key, value in records}
    assert latest[b"k3"] is None, "the tombstone must still be visible to a consumer from the beginning"
    assert {k: v for k, v in latest.items() if v is not None} == {
        key: f"{key.decode()}=v4".encode() for key in keys if key != b"k3"
    }
