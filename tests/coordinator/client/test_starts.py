"""A start rule resolved against a real broker: earliest, latest (read_committed) and a timestamp,
per partition; a topic that does not exist yet resolves to nothing."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Producer

from coordinator.client.offsets import EndOffsets
from coordinator.client.starts import resolve_start
from coordinator.domain.events import CutEntry
from coordinator.settings import Settings


def produce(bootstrap: str, topic: str, records: list[tuple[int, int]]) -> None:
    """(partition, timestamp ms) per record, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i, (partition, ts_ms) in enumerate(records):
        producer.produce(topic, value=str(i).encode(), partition=partition, timestamp=ts_ms)
    assert producer.flush(30) == 0


def test_each_rule_resolves_to_the_offsets_it_names_in_every_partition(
    settings: Settings, make_topic: Callable[..., str],
) -> None:
    topic = make_topic(partitions=2)
    # partition 0: 3 records at 1000, 2000, 3000; partition 1: 2 at 1500, 2500
    produce(settings.bootstrap, topic, [(0, 1000), (1, 1500), (0, 2000), (1, 2500), (0, 3000)])
    offsets = EndOffsets(settings)
    try:
        assert resolve_start(offsets, (topic,), "earliest") == (CutEntry(topic, 0, 0), CutEntry(topic, 1, 0))
        assert resolve_start(offsets, (topic,), "latest") == (CutEntry(topic, 0, 3), CutEntry(topic, 1, 2))
        assert resolve_start(offsets, (topic,), "timestamp:2000") == (CutEntry(topic, 0, 1), CutEntry(topic, 1, 1))
        # no record that late in either partition: each starts at its end
        assert resolve_start(offsets, (topic,), "timestamp:9000") == (CutEntry(topic, 0, 3), CutEntry(topic, 1, 2))
        assert resolve_start(offsets, (topic, "no_such_topic_yet"), "latest") == (CutEntry(topic, 0, 3),
                                                                                   CutEntry(topic, 1, 2))
        assert resolve_start(offsets, ("no_such_topic_yet",), "latest") == ()
    finally:
        offsets.close()
