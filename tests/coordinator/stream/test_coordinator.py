"""The Coordinator's command handling against the session's real broker, driven directly."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer

from coordinator.client.topics import Topics, ensure_topics
from coordinator.codec import default_codec
from coordinator.domain import CutEntry, DeclareTable, RegisterJob, RequestRevision
from coordinator.domain.events import NO_PARTITIONS
from coordinator.domain.roles import Role
from coordinator.domain.work import work_for
from coordinator.settings import Settings
from coordinator.stream import coordinator as module
from coordinator.stream.coordinator import Coordinator
from tests.support import wait_until

pytestmark = [pytest.mark.integration]


def test_a_command_whose_deciding_raises_is_refused_with_why_and_the_next_one_is_decided(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = dataclasses.replace(settings, topic_prefix=f"t{uuid.uuid4().hex[:8]}")
    topics = Topics(settings.topic_prefix)
    ensure_topics(settings, topics)
    coordinator = Coordinator(settings, topics)
    coordinator.start()
    real_decide, codec = module.decide, default_codec()

    def decide(state: Any, command: Any, now_ms: int, *rest: Any) -> Any:
        if isinstance(command, RequestRevision):  # a bug in one handler, say
            raise KeyError("boom")
        return real_decide(state, command, now_ms, *rest)

    monkeypatch.setattr(module, "decide", decide)
    try:
        poison = coordinator.handle_command(codec.encode(RequestRevision("r1", "t", 0)), topics.commands_of(Role.OPERATOR))
        assert poison is not None and not poison.accepted
        assert poison.reason.startswith("the coordinator could not decide it (KeyError: 'boom')")
        after = coordinator.handle_command(codec.encode(DeclareTable("r2", "t", "root")), topics.commands_of(Role.JOB))
        assert after is not None and after.accepted
        legacy = coordinator.handle_command(codec.encode(DeclareTable("r3", "u", "root")), topics.commands)
        assert legacy is not None and not legacy.accepted and "predates roles" in legacy.reason
        assert coordinator.counters.commands_rejected == 2 and coordinator.counters.work_failures == 0
    finally:
        coordinator.stop()


def test_a_job_registered_while_a_barrier_is_cut_skips_that_barrier_and_reads_from_the_next(
    settings: Settings, make_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race a busy machine lost in the money-moves drill: the leader measures the topics of
    # the jobs it knows, and a job of another topic registers before the barrier is written.
    settings = dataclasses.replace(settings, topic_prefix=f"t{uuid.uuid4().hex[:8]}")
    topics, codec = Topics(settings.topic_prefix), default_codec()
    ensure_topics(settings, topics)
    lines, orders = make_topic(), make_topic()
    coordinator = Coordinator(settings, topics)
    coordinator.start()

    def decided(command: Any) -> None:
        outcome = coordinator.handle_command(codec.encode(command), topics.commands_of(Role.JOB))
        assert outcome is not None and outcome.accepted, outcome

    measure = coordinator.cut
    registrations = [RegisterJob("r3", "ingest_orders", "orders", external_topics=(orders,))]

    def cut_while_a_job_registers(measured: list[str]) -> list[CutEntry]:
        ends = measure(measured)
        while registrations:
            decided(registrations.pop())
        return ends

    try:
        for command in (DeclareTable("r0", "lines", "root"), DeclareTable("r1", "orders", "root"),
                        RegisterJob("r2", "ingest_lines", "lines", external_topics=(lines,))):
            decided(command)
        monkeypatch.setattr(coordinator, "cut", cut_while_a_job_registers)
        first = wait_until(coordinator.tick_barrier, "a barrier", 30)
        second = wait_until(coordinator.tick_barrier, "the next barrier", 30)
        assert {c.topic for c in first.cut} == {lines} and {c.topic for c in second.cut} == {lines, orders}
        with coordinator.follower.reader.lock:
            state = coordinator.state
        job = state.jobs["ingest_orders"]
        assert job.resume_barrier < first.barrier  # registered before the first barrier was written
        assert [w.barrier for w in work_for(state, job, job.resume_barrier, second.barrier)] == [second.barrier]
    finally:
        coordinator.stop()


def test_a_topic_that_does_not_exist_yet_is_cut_as_one_entry_holding_nothing(
    settings: Settings, make_topic: Callable[..., str], kafka_bootstrap: str
) -> None:
    # "No entry" must keep meaning "not measured" (the skip rule above); a missing topic is measured.
    settings = dataclasses.replace(settings, topic_prefix=f"t{uuid.uuid4().hex[:8]}")
    topics = Topics(settings.topic_prefix)
    ensure_topics(settings, topics)
    there, missing = make_topic(partitions=2), f"t_{uuid.uuid4().hex[:10]}"
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for _ in range(3):
        producer.produce(there, b"x", partition=1)
    assert producer.flush(30) == 0
    coordinator = Coordinator(settings, topics)
    coordinator.start()
    try:
        cut = coordinator.cut([there, missing])
    finally:
        coordinator.stop()
    assert len(cut) == 3
    assert set(cut) == {CutEntry(there, 0, 0), CutEntry(there, 1, 3), CutEntry(missing, NO_PARTITIONS, 0)}
