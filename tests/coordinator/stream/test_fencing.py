"""At most one barrier clock writes: a newer leader fences every earlier one (real broker)."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from coordinator.client.topics import Topics, ensure_topics
from coordinator.codec import default_codec
from coordinator.domain import BarrierAnnounced
from coordinator.settings import Settings
from coordinator.stream.fencing import Fenced, FencedWriter
from tests.support import wait_until


def committed_records(settings: Settings, topic: str) -> list[tuple[bytes, bytes | None]]:
    """Every record of ``topic`` written so far that a Lockstep reader sees (read committed)."""
    consumer = Consumer(settings.kafka_config({"group.id": uuid.uuid4().hex, "isolation.level": "read_committed",
                                               "enable.auto.commit": False}))
    partition = TopicPartition(topic, 0)
    end = consumer.get_watermark_offsets(partition, timeout=10)[1]
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out: list[tuple[bytes, bytes | None]] = []
    deadline = time.monotonic() + 30
    try:
        while consumer.position([partition])[0].offset < end:  # the position passes commit markers too
            assert time.monotonic() < deadline, f"{topic} not read up to {end} within 30 s"
            msg = consumer.poll(1)
            if msg is not None and msg.error() is None and msg.offset() is not None and msg.offset() < end:
                out.append((msg.key() or b"", msg.value()))
    finally:
        consumer.close()
    return out


def test_a_newer_writer_fences_the_older_until_it_leads_again(settings: Settings) -> None:
    settings = dataclasses.replace(settings, topic_prefix=f"f{uuid.uuid4().hex[:8]}")
    topics = Topics(settings.topic_prefix)
    ensure_topics(settings, topics)
    old, new = FencedWriter(settings), FencedWriter(settings)
    try:
        old.write([(topics.barriers, b"k", b"old 1")])
        new.start()  # a new leader: from here on nothing the old one writes lands
        with pytest.raises(Fenced):
            old.write([(topics.barriers, b"k", b"old 2")])
        with pytest.raises(Fenced):
            old.start()  # and it does not start again by itself (that would fence the new leader)
        marks = new.write([(topics.barriers, b"k", b"new 1")])
        assert marks == {topics.barriers: marks[topics.barriers]} and marks[topics.barriers] > 1
        old.rejoin()  # a rebalance made it the leader again
        old.write([(topics.barriers, b"k", b"old 3")])
        with pytest.raises(Fenced):
            new.write([(topics.barriers, b"k", b"new 2")])
        assert [v for _, v in committed_records(settings, topics.barriers)] == [b"old 1", b"new 1", b"old 3"]
    finally:
        old.close()
        new.close()


@pytest.mark.slow
def test_a_paused_leader_resumed_after_the_failover_announces_nothing(
    make_worker: Callable, coordinator_env: dict[str, str], settings: Settings,
) -> None:
    paused = make_worker(start=False)
    paused.env["LOCKSTEP_CRASH_AT"] = "pause_before_announce"  # planned barrier 1, then SIGSTOP (as a long GC)
    paused.launch()
    wait_until(lambda: process_state(paused.proc.pid) == "T", "the leader paused before announcing", timeout=90)
    standby = make_worker()  # leads once the paused worker's session (10 s) has expired
    wait_until(lambda: len(standby.get("/barriers?limit=1000")) >= 5, "the new leader's barriers", timeout=90)
    os.kill(paused.proc.pid, signal.SIGCONT)  # it finishes its tick: writes its barrier 1, or is refused
    wait_until(lambda: any(paused.metric(f"lockstep_{counter}_total") for counter in ("fenced_writes", "barriers_announced")),
               "the old leader's tick", timeout=60)
    # After the rebalance either may lead (Faust may hand the old one everything again; it then
    # fences the other in turn): at most one writes at a time, and barriers go on.
    resumed_at = len(standby.get("/barriers?limit=1000"))
    wait_until(lambda: len(standby.get("/barriers?limit=1000")) >= resumed_at + 5, "barriers after the resume", timeout=60)

    prefixed = dataclasses.replace(settings, topic_prefix=coordinator_env["LOCKSTEP_TOPIC_PREFIX"])
    codec = default_codec()
    contents: dict[int, set[BarrierAnnounced]] = defaultdict(set)
    for key, value in committed_records(prefixed, Topics(prefixed.topic_prefix).barriers):
        assert value is not None, f"a tombstone for {key!r}: nothing was pruned yet"
        barrier = codec.decode(value)
        contents[barrier.barrier].add(barrier)
    assert 1 in contents and len(contents) >= 5
    assert all(len(versions) == 1 for versions in contents.values()), "a barrier id announced twice, differently"
    assert paused.metric("lockstep_fenced_writes_total"), "the old leader's write was refused"
    first = "/barriers?from=1&limit=3"
    assert paused.get(first) == standby.get(first), "the resumed worker follows the new leader's barriers"


def process_state(pid: int) -> str:
    """R, S, T (stopped), ... from /proc."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_the_leader_s_timers_write_at_once_without_tripping_over_one_transaction(settings: Settings) -> None:
    settings = dataclasses.replace(settings, topic_prefix=f"f{uuid.uuid4().hex[:8]}")
    topics = Topics(settings.topic_prefix)
    ensure_topics(settings, topics)
    writer = FencedWriter(settings)  # the barrier clock, pruning and lease expiry share it from their threads
    errors: list[BaseException] = []

    def timer(name: str) -> None:
        try:
            for i in range(20):
                writer.write([(topics.barriers, f"{name}{i}".encode(), b"v")])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=timer, args=(name,)) for name in "abcd"]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert len(committed_records(settings, topics.barriers)) == 80
    finally:
        writer.close()
