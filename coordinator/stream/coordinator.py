"""The coordinator's work, free of Faust: decide commands, run the barrier clock, expire leases,
prune the state and write back completions that someone else's tombstone erased.

Faust (``coordinator.stream.app``) only schedules these calls; tests and tools can drive a
Coordinator directly. Every decision waits until the local state has folded everything
written so far, so two commands never race against a stale state.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from confluent_kafka import Producer, TopicPartition

from coordinator.client.clock import now_ms
from coordinator.client.commands import new_request_id
from coordinator.client.delivery import Delivered
from coordinator.client.offsets import EndOffsets
from coordinator.client.state import StateFollower
from coordinator.client.topics import Topics
from coordinator.codec import DecodeError, default_codec
from coordinator.domain import (
    AbandonTable,
    BarrierAnnounced,
    BarrierCompleted,
    Command,
    CommandOutcome,
    CutEntry,
    Decision,
    Fact,
    JobState,
    LeaseState,
    MetaState,
    TableState,
    Tombstone,
    decide,
    entity_key,
    expire_leases,
)
from coordinator.domain.barriers import BarrierConfig
from coordinator.domain.decide import abandoned_tables
from coordinator.domain.delays import kafka_backlog
from coordinator.domain.events import NO_PARTITIONS, split_key
from coordinator.domain.pacer import Pacer
from coordinator.domain.pruning import prunable, restorable
from coordinator.domain.roles import Role
from coordinator.faults import crash_point
from coordinator.settings import Settings
from coordinator.stream.fencing import Fenced, FencedWriter
from coordinator.stream.metrics import FoldMetrics

log = logging.getLogger(__name__)

TICK_MS = 50  # how often the leader asks whether a barrier is due


REJECTIONS_KEPT = 20  # commands this worker rejected, newest kept for the live page
ERASURES_KEPT = 10_000  # completions others' tombstones erased, kept until the leader's next look


@dataclass
class Counters:
    commands_accepted: int = 0
    commands_rejected: int = 0
    command_decode_errors: int = 0
    barriers_announced: int = 0
    barriers_held_back: int = 0
    leases_expired: int = 0
    records_pruned: int = 0
    ctas_abandoned: int = 0
    completions_restored: int = 0  # written back after a tombstone that was not the coordinator's
    work_failures: int = 0  # a timer's or a command's work that raised (broker gone, timeouts); retried
    fenced_writes: int = 0  # leader writes refused because a newer leader took over


class Coordinator:
    def __init__(self, settings: Settings, topics: Topics, barrier_config: BarrierConfig | None = None) -> None:
        self.settings = settings
        self.topics = topics
        self.barrier_config = barrier_config or settings.barriers
        self.codec = default_codec(settings.schemas)
        self.follower = StateFollower(settings, topics)
        self.metrics = FoldMetrics()  # /metrics' histograms and counters, fed by every completion folded
        self.follower.reader.on_fold = self.metrics.observe
        self.follower.reader.before_fold = self._note_erasure
        self._own: set[str] = set()  # keys of the completions' tombstones this worker writes
        self._erased: dict[str, BarrierCompleted] = {}  # what others' tombstones erased (tick_restore)
        self.producer = Producer(settings.kafka_config({"enable.idempotence": True, "linger.ms": 0},
                                                       client="lockstep-coordinator"))
        self.leader_writer = FencedWriter(settings)  # the barrier clock's, pruning's and lease expiry's writes
        self.offsets = EndOffsets(settings)
        self.counters = Counters()
        self._due: int | None = None  # when the next barrier is due (None: held back)
        self._planned_at_events = -1  # events folded when that was planned
        self._planned_at_ms = 0
        self._pacer = Pacer(self.barrier_config)  # the clock's plan, kept between ticks
        self._proposed: dict[str, int] = {}  # table -> when the leader last proposed dropping it
        self.rejections: deque[dict[str, object]] = deque(maxlen=REJECTIONS_KEPT)  # the newest, for the page
        self.started_at_ms = now_ms()  # the page's delays count this worker's time only

    def start(self) -> None:
        self.follower.start()
        self.follower.wait_current(timeout=120)

    def stop(self) -> None:
        self.follower.stop()
        self.producer.flush(10)
        self.leader_writer.close()
        self.offsets.close()

    @property
    def state(self) -> MetaState:
        """The live state; hold ``self.follower.reader.lock`` while reading it."""
        return self.follower.reader.state

    # -- writing facts ------------------------------------------------------------------------

    def topic_of(self, fact: Fact | Tombstone | CommandOutcome) -> str:
        match fact:
            case TableState() | JobState():
                return self.topics.registry
            case LeaseState():
                return self.topics.leases
            case BarrierAnnounced():
                return self.topics.barriers
            case BarrierCompleted():
                return self.topics.completions
            case CommandOutcome():
                return self.topics.outcomes
            case Tombstone(key=key):
                kind = split_key(key)[0]
                return {"table": self.topics.registry, "job": self.topics.registry, "lease": self.topics.leases,
                        "barrier": self.topics.barriers, "completion": self.topics.completions}[kind]
        raise TypeError(f"no topic for {type(fact).__name__}")

    def _record(self, fact: Fact | Tombstone) -> tuple[str, bytes, bytes | None]:
        """(topic, key, value) of a fact: keyed by its entity, a tombstone without a value."""
        value = None
        if isinstance(fact, Tombstone):
            if split_key(fact.key)[0] == "completion":
                self._own.add(fact.key)
        else:
            value = self.codec.encode(fact)
        return self.topic_of(fact), entity_key(fact).encode(), value

    def _note_erasure(self, state: MetaState, event: object) -> None:
        """Before a completion's tombstone is folded: keep what it erases unless this worker
        wrote it (pruning, a drop); only while leading (the follower's lock is held)."""
        if not isinstance(event, Tombstone) or split_key(event.key)[0] != "completion":
            return
        if event.key in self._own:
            self._own.discard(event.key)
            return
        table, _, barrier = split_key(event.key)[1].rpartition("@")
        done = state.completions.get(table, {}).get(int(barrier)) if barrier.isdigit() else None
        if done is not None and self.leader_writer.leading and len(self._erased) < ERASURES_KEPT:
            self._erased[event.key] = done

    def write(self, facts: list[Fact | Tombstone]) -> None:
        """Produce facts (keyed by entity) and wait until our own follower has folded them."""
        delivered = Delivered()
        for topic, key, value in map(self._record, facts):
            self.producer.produce(topic, key=key, value=value, on_delivery=delivered)
        # Wait for every fact's fate (the producer's message timeout bounds it): planning again
        # while one is still on its way could announce a second, different barrier of one id.
        while (undelivered := self.producer.flush(30)) > 0:
            log.warning("%d fact(s) still on their way to the broker; waiting", undelivered)
        if delivered.errors:
            raise RuntimeError(f"could not write facts: {delivered.errors}")
        self.follower.wait_for(delivered.marks)

    def _lead(self) -> bool:
        """Fence every earlier leader before this one reads the state it plans from
        (``coordinator.stream.fencing``); False while a newer leader has fenced this one."""
        try:
            self.leader_writer.start()
        except Fenced:
            return False
        return True

    def _write_as_leader(self, facts: list[Fact | Tombstone]) -> bool:
        """Write the leader's facts in one fenced transaction and wait until they are folded;
        False (counted) if a newer leader has taken over."""
        try:
            marks = self.leader_writer.write([self._record(f) for f in facts])
        except Fenced:
            self.counters.fenced_writes += 1
            return False
        self.follower.wait_for(marks)
        return True

    # -- commands --------------------------------------------------------------------------------

    def handle_command(self, raw: bytes | None, topic: str) -> CommandOutcome | None:
        """Decide one command from ``topic`` with the role that topic speaks for
        (``Topics.command_topics``); the pre-role topic's commands are all refused."""
        try:
            command = self.codec.decode(raw or b"")
        except DecodeError as exc:
            self.counters.command_decode_errors += 1
            log.warning("skipped undecodable command on %s: %s", topic, exc)
            return None
        if not hasattr(command, "request_id"):
            self.counters.command_decode_errors += 1
            log.warning("skipped %s on %s: it is not a command", type(command).__name__, topic)
            return None
        self.follower.wait_current()
        role = self.topics.command_topics.get(topic)
        with self.follower.reader.lock:
            if role is None:
                decision = refused(command, f"{topic} is no longer read: this client predates roles; upgrade it "
                                   f"(commands go to {self.topics.prefix}.commands.<role>, docs/security.md)")
            else:
                try:
                    decision = decide(self.state, command, now_ms(), role, self.settings.leases)
                except Exception as exc:  # noqa: BLE001 - a poison command: refused with why, never retried
                    log.exception("could not decide %s %s", type(command).__name__, command.request_id)
                    decision = refused(command, f"the coordinator could not decide it ({type(exc).__name__}: {exc}); "
                                       "this is a bug, please report it")
        if decision.facts:
            self.write(list(decision.facts))
        self.producer.produce(self.topics.outcomes, key=command.request_id.encode(), value=self.codec.encode(decision.outcome))
        self.producer.flush(30)
        if decision.outcome.accepted:
            self.counters.commands_accepted += 1
            if isinstance(command, AbandonTable):
                self.counters.ctas_abandoned += 1
        else:
            self.counters.commands_rejected += 1
            self.rejections.append({"at_ms": now_ms(), "command": decision.outcome.command,
                                    "request_id": command.request_id, "reason": decision.outcome.reason})
            log.info("rejected %s %s: %s", decision.outcome.command, command.request_id, decision.outcome.reason)
        return decision.outcome

    # -- barrier clock and lease expiry (leader only) ------------------------------------------------

    def cut(self, topics: list[str]) -> list[CutEntry]:
        """End offsets (read_committed) of every partition of the given external topics; a topic
        that does not exist yet is measured as holding nothing (``NO_PARTITIONS``)."""
        if not topics:
            return []
        metadata = self.offsets.topics()
        request, missing = [], []
        for topic in topics:
            if topic not in metadata:
                log.warning("external topic %s does not exist yet; its cut holds nothing of it", topic)
                missing.append(CutEntry(topic, NO_PARTITIONS, 0))
                continue
            request += [TopicPartition(topic, p) for p in metadata[topic].partitions]
        ends = self.offsets.latest(request, committed=True).items() if request else ()
        return missing + [CutEntry(tp.topic, tp.partition, offset) for tp, offset in ends]

    def kafka_backlog(self) -> dict[str, int]:
        """Per root table, the records its job has still to read (``delays.kafka_backlog``): the
        topics' end offsets asked of Kafka now, outside the state's lock."""
        with self.follower.reader.lock:
            topics = sorted({t for j in self.state.active_jobs() for t in j.external_topics})
        ends = self.cut(topics)
        with self.follower.reader.lock:
            return kafka_backlog(self.state, ends)

    def tick_barrier(self) -> BarrierAnnounced | None:
        """Announce the next barrier if it is due; called every ``TICK_MS`` on the leader. The
        pacing is planned again only when new facts were folded, the due time came, or a second
        passed (a job may have stopped counting as live)."""
        now = now_ms()
        folded = self.follower.reader.stats.events_folded
        if folded == self._planned_at_events and now < min(self._due or now + 1000, self._planned_at_ms + 1000):
            return None
        with self.follower.reader.lock:
            self._due = self._pacer.next_due(self.state, now)
        self._planned_at_events, self._planned_at_ms = folded, now
        if self._due is None:
            self.counters.barriers_held_back += 1
            return None
        if now < self._due or not self._lead():
            return None
        self.follower.wait_current()
        with self.follower.reader.lock:
            topics = self.state.external_topics()
        cut = self.cut(topics)
        with self.follower.reader.lock:
            barrier = self._pacer.plan_barrier(self.state, now_ms(), cut)
        if barrier is None:
            self.counters.barriers_held_back += 1
            return None
        crash_point("pause_before_announce", self.settings.crash_at)
        if not self._write_as_leader([barrier]):
            return None
        self.counters.barriers_announced += 1
        self._planned_at_events = -1  # plan the next one afresh
        return barrier

    def tick_prune(self) -> int:
        """Forget the barrier and completion records below the retention floor that nothing needs
        any more (``coordinator.domain.pruning``), and propose dropping CTAS tables whose runner
        went silent before their first commit; returns how many records were written."""
        if not self._lead():
            return 0
        now = now_ms()
        with self.follower.reader.lock:
            abandoned = abandoned_tables(self.state, now, self.settings.barriers.liveness_ms)
            stale = prunable(self.state, self.settings.retain_barriers)
        self._propose_abandonment(abandoned, now)
        if stale and self._write_as_leader(list(stale)):
            self.counters.records_pruned += len(stale)
            return len(stale)
        return 0

    def tick_restore(self) -> int:
        """Write back the completions that a tombstone this worker did not write erased, unless
        pruning would have forgotten them too (``pruning.restorable``): a job principal may write
        the completions topic, and so a tombstone, but only pruning and drops remove an exact
        point. Returns how many were written back."""
        if not self._erased or not self._lead():
            return 0
        self.follower.wait_current()
        with self.follower.reader.lock:
            erased, self._erased = self._erased, {}
            back = restorable(self.state, erased.values(), self.settings.retain_barriers)
        if back and self._write_as_leader(list(back)):
            self.counters.completions_restored += len(back)
            log.warning("wrote back %d completion(s) that a tombstone the coordinator did not write erased: %s",
                        len(back), ", ".join(f"{c.table}@{c.barrier}" for c in back))
            return len(back)
        return 0

    def _propose_abandonment(self, tables: list[str], now: int) -> None:
        """Send ``AbandonTable`` for each table (once per liveness window while it stays
        pending): the commands agent decides it in order with every other command."""
        silent_ms = 2 * self.settings.barriers.liveness_ms
        self._proposed = {t: at for t, at in self._proposed.items() if t in tables and now - at < silent_ms // 2}
        for table in tables:
            if table in self._proposed:
                continue
            self._proposed[table] = now
            command = AbandonTable(new_request_id(), table, silent_ms)
            self.producer.produce(self.topics.commands_of(Role.COORDINATOR), key=command.request_id.encode(),
                                  value=self.codec.encode(command))
        if tables:
            self.producer.flush(30)

    def tick_leases(self) -> int:
        if not self._lead():
            return 0
        with self.follower.reader.lock:
            expired = expire_leases(self.state, now_ms())
        if expired and self._write_as_leader(list(expired)):
            self.counters.leases_expired += len(expired)
            return len(expired)
        return 0


def refused(command: Command, reason: str) -> Decision:
    """The decision that refuses ``command`` for ``reason`` before its rules are asked."""
    return Decision((), CommandOutcome(command.request_id, type(command).__name__, False, reason, (), now_ms()))
