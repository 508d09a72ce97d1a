"""Pruning forgets old barrier and completion records, never what a reader, a job, a lease or a
revise within the horizon can still need."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain import (
    BarrierAnnounced,
    BarrierCompleted,
    CutEntry,
    DeregisterJob,
    MetaState,
    OffsetRange,
    RequestRevision,
    decide,
    fold_all,
)
from coordinator.domain.pruning import AHEAD, prunable, retention_floor
from coordinator.domain.work import work_for
from tests.support.strategies import state_topics


def pruned(state: MetaState, retain: int) -> MetaState:
    return fold_all(prunable(state, retain), state.copy())


@settings(max_examples=300)
@given(state_topics, st.integers(0, 6))
def test_pruning_keeps_every_point_someone_can_still_read(topics: dict[str, list[Any]], retain: int) -> None:
    state = fold_all([r for records in topics.values() for r in records])
    after = pruned(state, retain)
    floor = retention_floor(state, retain)
    assert after.last_barrier() == state.last_barrier()  # barrier ids continue after a restart
    for table in state.tables:
        assert after.latest_exact(table) == state.latest_exact(table)
        assert {b: v for b, v in state.exact_points(table).items() if b > floor} == \
            {b: v for b, v in after.exact_points(table).items() if b > floor}
        for lease in state.leases.values():
            assert after.exact_points(table).get(lease.barrier) == state.exact_points(table).get(lease.barrier)
    for job in state.jobs.values():
        assert (job.resume_barrier in after.barriers) == (job.resume_barrier in state.barriers)
    names = sorted(state.tables)
    for pair in zip(names, names[1:], strict=False):
        if (common := state.common_barrier(pair)) is not None and common > floor:
            assert after.common_barrier(pair) == common
    assert prunable(after, retain) == []  # one pass forgets all it can


def test_old_records_go_and_the_state_stays_small(make_state: Callable[..., MetaState]) -> None:
    done = [BarrierCompleted(j, t, b, 0, b) for b in range(1, 501)
            for j, t in (("ingest_shopping", "shopping"), ("amount_job", "user_item_amount"),
                         ("price_job", "user_item_price"))]
    state = make_state(*(BarrierAnnounced(b, b) for b in range(1, 501)), *done, shopping_topology=True)
    after = pruned(state, retain=100)
    assert sorted(after.barriers) == list(range(401, 501))
    assert all(sorted(by_b) == list(range(401, 501)) for by_b in after.completions.values())


def test_completions_no_writer_makes_go_whatever_the_floor(make_state: Callable[..., MetaState]) -> None:
    forged = [BarrierCompleted("ingest_shopping", "ghost", b, 0, b) for b in (1, 2)]
    ahead = [BarrierCompleted("ingest_shopping", "shopping", b, 0, b) for b in (4 + AHEAD, 10**9)]
    state = make_state(*(BarrierAnnounced(b, b) for b in (1, 2, 3)),
                       *(BarrierCompleted("ingest_shopping", "shopping", b, 0, b) for b in (1, 2, 3)),
                       *forged, *ahead, shopping_topology=True)
    after = pruned(state, retain=100)
    assert "ghost" not in after.completions
    assert sorted(after.completions["shopping"]) == [1, 2, 3]  # the clock's own, and one just within reach stay
    assert sorted(pruned(make_state(*(BarrierAnnounced(b, b) for b in (1, 2, 3)),
                                    BarrierCompleted("ingest_shopping", "shopping", 2 + AHEAD, 0, 1),
                                    shopping_topology=True), retain=100).completions["shopping"]) == [2 + AHEAD]


def test_a_stopped_job_resumes_from_its_last_cut_without_gap_or_overlap(make_state: Callable[..., MetaState]) -> None:
    def cut(b: int) -> tuple[CutEntry, ...]:
        return (CutEntry("shopping_source", 0, 10 * b),)

    early = [BarrierCompleted("ingest_shopping", "shopping", b, 0, b) for b in range(1, 6)]
    later = [BarrierCompleted(j, t, b, 0, b) for b in range(1, 201) for j, t in
             (("amount_job", "user_item_amount"), ("price_job", "user_item_price"))]
    state = make_state(*(BarrierAnnounced(b, b, cut(b)) for b in range(1, 201)), *early, *later,
                       DeregisterJob("r", "ingest_shopping", "FINISHED"), shopping_topology=True)
    after = pruned(state, retain=20)
    assert 5 in after.barriers and 5 in after.completions["shopping"]  # its newest exact point
    assert all(after.completions[t].keys() >= {5} for t in ("user_item_amount", "user_item_price"))  # joins with it
    assert 100 not in after.barriers
    job = after.jobs["ingest_shopping"]
    first = work_for(after, job, 3, 200)[0]  # its checkpoint lagged its last commit (barrier 5)
    # far behind, it commits at multiples of the stride: the first one kept, from the cut of barrier 5
    assert (first.barrier, first.offsets) == (190, [OffsetRange("shopping_source", 0, 50, 1900)])


def test_revising_below_the_retention_floor_is_rejected_with_a_reason(make_state: Callable[..., MetaState]) -> None:
    done = [BarrierCompleted(j, t, b, 0, b) for b in range(1, 51) for j, t in
            (("ingest_shopping", "shopping"), ("amount_job", "user_item_amount"), ("price_job", "user_item_price"))]
    state = pruned(make_state(*(BarrierAnnounced(b, b) for b in range(1, 51)), *done, shopping_topology=True), 10)
    outcome = decide(state, RequestRevision("r", "shopping", 12), now_ms=1).outcome
    assert not outcome.accepted and "below the retention floor" in outcome.reason
    assert decide(state, RequestRevision("r", "shopping", 45), now_ms=1).outcome.accepted
