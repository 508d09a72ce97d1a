"""Pacing: the next barrier is announced when it would reach every job just as the job is free."""

from __future__ import annotations

from coordinator.domain import BarrierAnnounced, BarrierCompleted, JobState, MetaState, TableState, fold_all
from coordinator.domain.barriers import BarrierConfig, next_due
from coordinator.domain.pacing import JobPace, due_at, job_pace

ROOT = JobState("root", "events", external_topics=("x",))
AGG = JobState("agg", "totals", sources=("events",))



def make_chain(barriers: int = 3, root_cost: int = 1000, agg_cost: int = 2000, spacing: int = 3000) -> MetaState:
    """Root -> aggregate; barrier b announced at b * spacing, each job starts 100 ms after its
    input is ready and takes its cost (no queueing: spacing > both costs)."""
    facts: list[object] = [TableState("events", "root"), TableState("totals", "derived"), ROOT, AGG]
    for b in range(1, barriers + 1):
        announced = b * spacing
        root_done = announced + 100 + root_cost
        facts += [
            BarrierAnnounced(b, announced),
            BarrierCompleted("root", "events", b, 0, b, started_at_ms=announced + 100, committed_at_ms=root_done),
            BarrierCompleted("agg", "totals", b, 0, b, started_at_ms=root_done + 100,
                             committed_at_ms=root_done + 100 + agg_cost),
        ]
    return fold_all(facts)  # type: ignore[arg-type]


def test_a_job_pace_is_its_median_cost_and_start_lag() -> None:
    state = make_chain()
    assert job_pace(state, ROOT, 3) == JobPace(cost_ms=1000, lag_ms=100)
    assert job_pace(state, AGG, 3) == JobPace(cost_ms=2000, lag_ms=100)


def test_without_history_the_interval_alone_spaces_barriers() -> None:
    state = fold_all([TableState("events", "root"), ROOT, BarrierAnnounced(1, 1000)])
    assert due_at(state, [ROOT], now_ms=1100, interval_ms=500) == 1500


def test_the_next_barrier_reaches_the_slow_aggregate_just_as_it_is_free() -> None:
    # Barrier 4: the root committed it at 13,100; the aggregate (2 s a barrier) works on it
    # until 15,200. A barrier announced at t reaches the aggregate at t + 100 + 1000 + 100.
    state = fold_all([BarrierAnnounced(4, 12_000),
                      BarrierCompleted("root", "events", 4, 0, 4, started_at_ms=12_100, committed_at_ms=13_100)],
                     make_chain())
    assert due_at(state, [ROOT, AGG], now_ms=13_500, interval_ms=500) == 14_000
    # Without the aggregate, the root alone is free at 13,100 and starts 100 ms after an announce.
    assert due_at(state, [ROOT], now_ms=13_500, interval_ms=500) == 13_000


def test_a_job_whose_source_has_no_live_writer_does_not_pace_the_clock() -> None:
    state = fold_all([BarrierAnnounced(4, 12_000)], make_chain())
    assert due_at(state, [AGG], now_ms=12_100, interval_ms=500) == 12_500


def test_barriers_queued_in_a_job_push_the_next_one_back() -> None:
    # Barriers 4 and 5 announced together; the root (1 s each) is still on neither.
    state = fold_all([BarrierAnnounced(4, 12_000), BarrierAnnounced(5, 12_000)], make_chain())
    # Root plays 4: free at max(12,000 + 100, 0) + 1000 = 13,100; then 5: 14,100.
    assert due_at(state, [ROOT], now_ms=12_000, interval_ms=500) == 14_000


def test_next_due_holds_back_while_more_than_max_inflight_barriers_are_incomplete() -> None:
    state = fold_all([BarrierAnnounced(b, 12_000) for b in (4, 5, 6)], make_chain())
    config = BarrierConfig(interval_ms=500, max_inflight=2, liveness_ms=10**9)
    assert next_due(state, 12_000, config) is None
    state = fold_all([BarrierCompleted("root", "events", 4, 0, 4, started_at_ms=12_100, committed_at_ms=13_100),
                      BarrierCompleted("agg", "totals", 4, 0, 4, started_at_ms=13_200, committed_at_ms=15_200)], state)
    assert next_due(state, 15_200, config) is not None
