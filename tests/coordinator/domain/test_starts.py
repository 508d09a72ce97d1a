"""A table's identity and its start rule: made when it is declared, kept while it exists, and
where its first barrier (and a revision from scratch) begins reading."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coordinator.domain import (
    BarrierAnnounced,
    BarrierCompleted,
    CutEntry,
    DeclareTable,
    DropTable,
    MetaState,
    OffsetRange,
    RegisterJob,
    RequestRevision,
    TableState,
    decide,
)
from coordinator.domain.work import EARLIEST, ready_barrier, work_for

MakeState = Callable[..., MetaState]
LATEST_AT = (CutEntry("src", 0, 40), CutEntry("src", 1, 25))


def declared(state: MetaState, command: DeclareTable) -> TableState:
    decision = decide(state, command, now_ms=5)
    assert decision.outcome.accepted, decision.outcome.reason
    (table,) = decision.facts
    assert isinstance(table, TableState)
    return table


def test_a_declared_table_gets_an_id_of_its_own_that_a_failover_decides_again_the_same(make_state: MakeState) -> None:
    first = declared(MetaState(), DeclareTable("req-1", "orders", "root"))
    again = declared(MetaState(), DeclareTable("req-1", "orders", "root"))  # the same command, decided after a failover
    other = declared(MetaState(), DeclareTable("req-2", "orders", "root"))  # another pipeline's table of that name
    assert len(first.table_id) == 16 and first.table_id == again.table_id != other.table_id
    assert (first.start, first.start_offsets) == ("earliest", ())


def test_running_the_pipeline_again_keeps_the_tables_id_start_and_offsets(make_state: MakeState) -> None:
    state = make_state(DeclareTable("req-1", "orders", "root", start="latest", start_offsets=LATEST_AT))
    table = state.tables["orders"]
    later = (CutEntry("src", 0, 90), CutEntry("src", 1, 80))  # what the rule resolves to at the next run
    decision = decide(state, DeclareTable("req-2", "orders", "root", start="latest", start_offsets=later), now_ms=9)
    assert decision.outcome.accepted and decision.facts == ()  # nothing changes
    assert (table.start, table.start_offsets) == ("latest", LATEST_AT)


def test_a_dropped_and_declared_again_table_is_another_table(make_state: MakeState) -> None:
    state = make_state(DeclareTable("req-1", "orders", "root"))
    before = state.tables["orders"].table_id
    state = make_state(DeclareTable("req-1", "orders", "root"), DropTable("req-2", "orders"),
                       DeclareTable("req-3", "orders", "root", start="latest", start_offsets=LATEST_AT))
    assert state.tables["orders"].table_id != before
    assert state.tables["orders"].start_offsets == LATEST_AT


def test_a_table_declared_before_tables_had_ids_gets_one_at_its_next_declaration(make_state: MakeState) -> None:
    old = TableState("orders", "root", writers=())  # as an older coordinator recorded it
    state = make_state(old)
    decision = decide(state, DeclareTable("req-9", "orders", "root"), now_ms=9)
    (table,) = decision.facts
    assert isinstance(table, TableState) and len(table.table_id) == 16
    assert table.start_offsets == () and decide(make_state(old, table), DeclareTable("req-10", "orders", "root"),
                                                 now_ms=10).facts == ()


@pytest.mark.parametrize(("command", "reason"), [
    (DeclareTable("r", "orders", "root", start="newest"), "'start' = 'newest' is not a start rule"),
    (DeclareTable("r", "orders", "root", start="timestamp:soon"), "is not a start rule"),
    (DeclareTable("r", "sums", "intermediate", start="latest"), "only a root table has a 'start'"),
    (DeclareTable("r", "orders", "root", start_offsets=(CutEntry("src", 0, -5),)), "start offset of src[0] -5 is outside"),
    (DeclareTable("r", "orders", "root", start_offsets=(CutEntry("no topic!", 0, 5),)), "invalid start topic"),
])
def test_a_bad_start_is_rejected_with_what_to_write(command: DeclareTable, reason: str) -> None:
    decision = decide(MetaState(), command, now_ms=5)
    assert not decision.outcome.accepted and reason in decision.outcome.reason


def test_a_changed_start_applies_to_a_new_table_only(make_state: MakeState) -> None:
    state = make_state(DeclareTable("req-1", "orders", "root"))
    decision = decide(state, DeclareTable("req-2", "orders", "root", start="latest", start_offsets=LATEST_AT), now_ms=9)
    assert not decision.outcome.accepted
    assert "started reading its topics as 'start' = 'earliest' said" in decision.outcome.reason
    assert "`lockstep drop orders`" in decision.outcome.reason


def latest_table(make_state: MakeState, *later: object) -> MetaState:
    return make_state(DeclareTable("r1", "orders", "root", start="latest", start_offsets=(CutEntry("src", 0, 40),)),
                      BarrierAnnounced(1, 1000, (CutEntry("src", 0, 30),)),
                      RegisterJob("r2", "ingest_orders", "orders", external_topics=("src",)),
                      BarrierAnnounced(2, 2000, (CutEntry("src", 0, 50), CutEntry("src", 1, 7))),
                      BarrierAnnounced(3, 3000, (CutEntry("src", 0, 60), CutEntry("src", 1, 9))), *later)


def test_the_first_barrier_begins_where_the_start_rule_resolved_and_a_new_partition_at_its_first_record(
    make_state: MakeState,
) -> None:
    state = latest_table(make_state)
    job = state.jobs["ingest_orders"]
    work = work_for(state, job, job.resume_barrier, ready_barrier(state, job))
    assert [(w.barrier, w.offsets) for w in work] == [
        (2, [OffsetRange("src", 0, 40, 50), OffsetRange("src", 1, EARLIEST, 7)]),
        (3, [OffsetRange("src", 0, 50, 60), OffsetRange("src", 1, 7, 9)]),
    ]


def test_a_restart_before_the_first_commit_and_a_full_revision_begin_there_again(make_state: MakeState) -> None:
    state = latest_table(make_state)
    job = state.jobs["ingest_orders"]
    assert work_for(state, job, job.resume_barrier, 3)[0].offsets[0] == OffsetRange("src", 0, 40, 50)
    done = [BarrierCompleted("ingest_orders", "orders", b, 0, b, source_offsets=(OffsetRange("src", 0, 40, 50),))
            for b in (2,)]
    revised = latest_table(make_state, *done, RequestRevision("r3", "orders", 0, full=True))
    job = revised.jobs["ingest_orders"]
    first, second, _ = work_for(revised, job, job.resume_barrier, 3)  # from barrier 1, cut before the start
    assert (first.barrier, first.offsets, first.restore_to) == (1, [OffsetRange("src", 0, 40, 40)], (0, -1))
    assert second.offsets[0] == OffsetRange("src", 0, 40, 50)


def test_a_start_resolved_after_a_cut_reads_nothing_at_that_barrier(make_state: MakeState) -> None:
    state = make_state(DeclareTable("r1", "orders", "root", start="latest", start_offsets=(CutEntry("src", 0, 70),)),
                       RegisterJob("r2", "ingest_orders", "orders", external_topics=("src",)),
                       BarrierAnnounced(1, 1000, (CutEntry("src", 0, 60),)),
                       BarrierAnnounced(2, 2000, (CutEntry("src", 0, 75),)))
    job = state.jobs["ingest_orders"]
    work = work_for(state, job, job.resume_barrier, 2)
    assert [w.offsets for w in work] == [[OffsetRange("src", 0, 70, 70)], [OffsetRange("src", 0, 70, 75)]]
