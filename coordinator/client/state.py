"""Read the compacted state topics from the beginning and fold them: the one way any
process (worker, ``lockstep replay``, tests, Spark jobs) rebuilds MetaState.

A record that cannot be decoded, or that its topic may not hold (``roles.STATE_KINDS``: a
job, which may write completions, cannot drop a table by writing its tombstone there), is
logged, counted and skipped; it never stops the reader.

Example::

    reader = StateReader(settings, Topics())
    state = reader.read_to_end()          # replay: everything written so far
    print(state.state_hash(), reader.stats)
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from coordinator.client.clock import now_ms
from coordinator.client.offsets import EndOffsets
from coordinator.client.topics import STATE_GROUP, Topics
from coordinator.codec import DecodeError, default_codec
from coordinator.domain import BarrierCompleted, MetaState, Tombstone, fold
from coordinator.domain.lineage import LineageTable, lineage_rows
from coordinator.domain.roles import placement_problem
from coordinator.domain.validity import record_problem
from coordinator.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class ReaderStats:
    events_folded: int = 0
    decode_errors: int = 0
    unknown_entities: int = 0
    invalid_records: int = 0  # decoded, but with a name, number or key no writer of Lockstep makes
    positions: dict[str, int] = field(default_factory=dict)


class StateReader:
    """Consumes every state topic (no consumer group: each reader sees all of them)."""

    def __init__(self, settings: Settings, topics: Topics) -> None:
        self.topics = topics
        self.state = MetaState()
        self.stats = ReaderStats()
        self.lock = threading.RLock()
        self.advanced = threading.Condition(self.lock)  # notified whenever a step has read on
        self.codec = default_codec(settings.schemas)
        self.consumer = Consumer(
            settings.kafka_config({
                "group.id": f"{settings.topic_prefix}{STATE_GROUP}{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "log_level": 3,
            }, client="lockstep-state")
        )
        self.partitions = [TopicPartition(t, 0) for t in topics.state]
        self.consumer.assign([TopicPartition(t, 0, OFFSET_BEGINNING) for t in topics.state])
        # Watermark queries come from other threads; they have their own client, which asks each
        # partition's current leader (coordinator.client.offsets).
        self.offsets = EndOffsets(settings)
        self.stats.positions = {t: 0 for t in topics.state}
        self.limits: dict[str, int] = {}
        # told of every fact folded, after the fold (the worker's metrics observe completions here)
        self.on_fold: Callable[[MetaState, object], None] | None = None
        # told of every fact about to be folded (the leader keeps what a completion's tombstone erases)
        self.before_fold: Callable[[MetaState, object], None] | None = None

    def close(self) -> None:
        self.consumer.close()
        self.offsets.close()

    def step(self, timeout: float = 0.2, max_records: int = 5000) -> int:
        """Fold what is available now, waiting up to ``timeout`` for the first record; returns how
        many records were read. (``Consumer.consume(n, timeout)`` would wait the whole timeout
        unless n records came, adding that wait to every command the coordinator decides.)"""
        first = self.consumer.poll(timeout)
        messages = [] if first is None else [first, *self.consumer.consume(max_records - 1, 0)]
        with self.lock:
            for msg in messages:
                self._apply(msg)
            self._pass_markers()
            self.advanced.notify_all()
        return len(messages)

    def _pass_markers(self) -> None:
        """A transaction's commit marker takes an offset but is no record: count the consumer's
        position past it as read, or a reader would wait for it for ever (the leader writes in
        transactions: ``coordinator.stream.fencing``)."""
        for tp in self.consumer.position(self.partitions):
            if tp.topic is not None and tp.offset > self.stats.positions.get(tp.topic, 0):
                self.stats.positions[tp.topic] = tp.offset

    def _apply(self, msg: Message) -> None:
        error, topic, offset = msg.error(), msg.topic(), msg.offset()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("state topic error: %s", error)
            return
        if topic is None or offset is None:  # not a record (confluent-kafka types every field optional)
            return
        if offset >= self.limits.get(topic, offset + 1):
            return  # past the requested mark (read_until)
        self.stats.positions[topic] = offset + 1
        key = (msg.key() or b"").decode("utf-8", "replace")
        value = msg.value()
        if value is None:
            event: object = Tombstone(key)
        else:
            try:
                event = self.codec.decode(value)
            except DecodeError as exc:
                self.stats.decode_errors += 1
                log.warning("skipped undecodable record %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), exc)
                return
        if (problem := placement_problem(self.topics.state_kind(topic), key) or record_problem(event, key)) is not None:
            self.stats.invalid_records += 1
            log.warning("skipped invalid record %s[%d]@%d: %s", topic, msg.partition(), offset, problem)
            return
        if isinstance(event, BarrierCompleted) and event.table not in self.state.tables:
            # Kept (the fold is order-independent), ignored by every view until the table exists.
            self.stats.unknown_entities += 1
            log.info("completion for unknown table %r at barrier %d (counted, not used)", event.table, event.barrier)
        if self.before_fold is not None:
            try:
                self.before_fold(self.state, event)
            except Exception:  # an observer's bug must not stop the fold
                log.exception("before_fold observer failed for %s", type(event).__name__)
        try:
            self.state = fold(self.state, event)  # type: ignore[arg-type]
        except TypeError as exc:
            self.stats.decode_errors += 1
            log.warning("skipped %s on state topic %s: %s", type(event).__name__, msg.topic(), exc)
            return
        self.stats.events_folded += 1
        if self.on_fold is not None:
            try:
                self.on_fold(self.state, event)
            except Exception:  # an observer's bug must not stop the fold
                log.exception("on_fold observer failed for %s", type(event).__name__)

    def end_offsets(self) -> dict[str, int]:
        """High watermarks of every state topic right now, in one request."""
        ends = self.offsets.latest(TopicPartition(topic, 0) for topic in self.topics.state)
        return {tp.topic: offset for tp, offset in ends.items()}

    def caught_up(self, marks: dict[str, int]) -> bool:
        return all(self.stats.positions.get(t, 0) >= off for t, off in marks.items())

    def read_to_end(self, timeout: float = 120.0) -> MetaState:
        """Fold at least everything written before this call; can be called again and again."""
        return self._read(self.end_offsets(), timeout)

    def read_until(self, marks: dict[str, int], timeout: float = 120.0) -> MetaState:
        """Fold each topic exactly up to its offset in ``marks`` and nothing after it (records
        past a mark are dropped, so this is the reader's last read), e.g. the positions a live
        coordinator reports with its state, to compare like with like."""
        self.limits = dict(marks)
        return self._read(marks, timeout)

    def _read(self, marks: dict[str, int], timeout: float) -> MetaState:
        deadline = time.monotonic() + timeout
        while not self.caught_up(marks):
            if time.monotonic() > deadline:
                raise TimeoutError(f"state topics not read up to {marks} within {timeout:.0f}s")
            self.step()
        return self.state


def read_state(settings: Settings) -> MetaState:
    """Fold the state topics up to their ends as of one moment, once (no coordinator needed).
    Exactly to those ends, not past them: a topic folded further than another could hold a
    completion whose barrier's announcement, written before it, is past the other's fold."""
    reader = StateReader(settings, Topics(settings.topic_prefix))
    try:
        return reader.read_until(reader.end_offsets())
    finally:
        reader.close()


class StateFollower(threading.Thread):
    """A StateReader that keeps folding in the background (the worker's live state)."""

    def __init__(self, settings: Settings, topics: Topics) -> None:
        super().__init__(name="lockstep-state-follower", daemon=True)
        self.reader = StateReader(settings, topics)
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.reader.step()
            except Exception:  # a bad record must never stop the follower
                log.exception("state follower step failed; continuing")
                time.sleep(0.5)
        self.reader.close()

    def stop(self) -> None:
        self._stopping.set()

    def wait_for(self, marks: dict[str, int], timeout: float = 30.0) -> None:
        """Block until every topic in ``marks`` has been folded up to its offset (woken by the
        follower's step, not by polling: every command and barrier waits here)."""
        with self.reader.advanced:
            if not self.reader.advanced.wait_for(lambda: self.reader.caught_up(marks), timeout):
                raise TimeoutError(f"state follower did not reach {marks} within {timeout:.0f}s")

    def wait_current(self, timeout: float = 30.0) -> None:
        """Block until everything written before this call is folded."""
        self.wait_for(self.reader.end_offsets(), timeout)


def lineage_tables(settings: Settings) -> Mapping[str, LineageTable]:
    """The lineage tables (``__meta_*``) as they are now: a fold of the state topics."""
    return lineage_rows(read_state(settings), now_ms(), settings.barriers.liveness_ms)
