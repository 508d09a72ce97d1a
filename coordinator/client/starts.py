"""A root table's start rule resolved to offsets, asked of Kafka by the runner that declares the
table (``coordinator.domain.starts`` says what each rule means). The coordinator keeps what the
first declaration resolved; a later declaration's answer is ignored.

Example::

    offsets = EndOffsets(settings)
    resolve_start(offsets, ("orders",), "latest")   # (CutEntry("orders", 0, 1532), CutEntry("orders", 1, 1490))
"""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import TopicPartition

from coordinator.client.offsets import EndOffsets
from coordinator.domain.events import CutEntry
from coordinator.domain.starts import LATEST, timestamp_of


def resolve_start(offsets: EndOffsets, topics: Sequence[str], rule: str) -> tuple[CutEntry, ...]:
    """Where ``rule`` starts each partition of ``topics`` as they are now. A topic that does not
    exist yet has no entry: its partitions start at their first record, whatever the rule."""
    known = offsets.topics()
    partitions = [TopicPartition(topic, p) for topic in dict.fromkeys(topics) if topic in known
                  for p in sorted(known[topic].partitions)]
    if not partitions:
        return ()
    if rule == LATEST:
        found = offsets.latest(partitions, committed=True)
    elif (ts_ms := timestamp_of(rule)) is not None:
        found = offsets.at_time(partitions, ts_ms)
        if late := [tp for tp, offset in found.items() if offset < 0]:  # no record that late: from the end
            found |= offsets.latest(late, committed=True)
    else:
        found = offsets.earliest(partitions)
    return tuple(CutEntry(tp.topic, tp.partition, offset) for tp, offset in sorted(
        found.items(), key=lambda item: (item[0].topic, item[0].partition)))
