"""The one rule for names and numbers: what the fold refuses, and that nothing Lockstep writes is refused."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coordinator.domain import (
    BarrierAnnounced,
    BarrierCompleted,
    CutEntry,
    DeclareTable,
    JobState,
    LeaseState,
    MetaState,
    SourceVersion,
    TableState,
    TableStride,
    Tombstone,
    decide,
    entity_key,
)
from coordinator.domain.validity import MAX_NUMBER, record_problem

MakeState = Callable[..., MetaState]


def test_everything_a_running_topology_holds_is_valid(make_state: MakeState) -> None:
    read = (SourceVersion("shopping", 2),)
    state = make_state(BarrierAnnounced(1, 100, (CutEntry("shopping_source", 0, 7),)),
                       BarrierCompleted("amount_job", "user_item_amount", 1, 0, 3, source_versions=read),
                       shopping_topology=True)
    facts = [*state.tables.values(), *state.jobs.values(), *state.barriers.values(),
             *(c for by in state.completions.values() for c in by.values())]
    assert facts and all(record_problem(f, entity_key(f)) is None for f in facts)
    assert record_problem(Tombstone("anything"), "anything") is None


@pytest.mark.parametrize(("record", "key", "reason"), [
    (BarrierAnnounced(2**63 - 1, 0), "barrier:9223372036854775807", "barrier id 9223372036854775807 is outside"),
    (BarrierAnnounced(0, 0), "barrier:0", "barrier id 0 is outside 1.."),
    (BarrierAnnounced(3, 0, (CutEntry("t", 0, -5),)), "barrier:3", "offset -5 is outside"),
    (BarrierAnnounced(4, 0, strides=(TableStride("t", 0, 1, 1),)), "barrier:4", "stride 0 is outside 1.."),
    (TableState("../../x", "root"), "table:../../x", "invalid table name '../../x'"),
    (TableState("x__dlq", "root"), "table:x__dlq", "reserved for Lockstep's own tables"),
    (TableState("t", "view"), "table:t", "unknown table kind 'view'"),
    (TableState("t", "root", writer="a b"), "table:t", "invalid writer 'a b'"),
    (TableState("t", "root"), "table:u", "its key 'table:u' is not 'table:t'"),
    (JobState("j", "t", status="PAUSED"), "job:j", "unknown job status 'PAUSED'"),
    (JobState("j", "t; DROP"), "job:j", "invalid sink 't; DROP'"),
    (BarrierCompleted("j", "t", 1, 0, -1), entity_key(BarrierCompleted("j", "t", 1, 0, -1)), "version -1 is outside"),
    (LeaseState("l", "me", 1, (SourceVersion("t", MAX_NUMBER + 1),), 0, 1), "lease:l", "version 9007199254740993"),
    (DeclareTable("r", "t", "root"), "table:t", "a DeclareTable is not a state fact"),
])
def test_a_record_no_lockstep_writer_makes_is_refused_with_its_reason(record: object, key: str, reason: str) -> None:
    problem = record_problem(record, key)
    assert problem is not None and reason in problem


def test_commands_and_records_share_the_name_rule() -> None:
    outcome = decide(MetaState(), DeclareTable("r", "x__dlq", "root"), now_ms=0).outcome
    assert not outcome.accepted and outcome.reason == record_problem(TableState("x__dlq", "root"), "table:x__dlq")
