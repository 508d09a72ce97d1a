"""Strides: a table far slower than the rest commits every k-th barrier and no longer paces or
holds back the clock; tables of like cost are never strided; a strided job reads every offset once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import astuple, replace

from coordinator.domain import (
    BarrierAnnounced,
    BarrierCompleted,
    CutEntry,
    JobState,
    MetaState,
    TableState,
    TableStride,
    fold,
    fold_all,
)
from coordinator.domain.barriers import BarrierConfig, next_due, plan_barrier
from coordinator.domain.pacer import Pacer
from coordinator.domain.pacing import due_at
from coordinator.domain.strides import choose_strides, paced_jobs
from coordinator.domain.work import ready_barrier, work_for

ROOT = JobState("root", "events", external_topics=("x",))
BIG = JobState("big", "joined", sources=("events",))
READER = JobState("reader", "report", sources=("joined",))
SMALL = JobState("small", "totals", sources=("events",))


def pipeline(barriers: int, big_cost: int, small_cost: int = 300, strided: tuple[TableStride, ...] = ()) -> MetaState:
    """events -> joined (costs ``big_cost``) -> report, and events -> totals: every job commits
    every barrier, announced every 5 s; the last barrier announces ``strided``."""
    facts: list[object] = [TableState(t, "root" if t == "events" else "derived") for t in ("events", "joined", "report",
                                                                                        "totals")]
    facts += [ROOT, BIG, READER, SMALL]
    for b in range(1, barriers + 1):
        at = b * 5000
        facts += [BarrierAnnounced(b, at, strides=strided if b == barriers else ()),
                  BarrierCompleted("root", "events", b, 0, b, started_at_ms=at, committed_at_ms=at + 200),
                  BarrierCompleted("big", "joined", b, 0, b, started_at_ms=at + 200, committed_at_ms=at + 200 + big_cost),
                  BarrierCompleted("small", "totals", b, 0, b, started_at_ms=at + 200,
                                   committed_at_ms=at + 200 + small_cost),
                  BarrierCompleted("reader", "report", b, 0, b, started_at_ms=at + 200 + big_cost,
                                   committed_at_ms=at + 300 + big_cost)]
    return fold_all(facts)  # type: ignore[arg-type]


def live(state: MetaState) -> list[JobState]:
    return list(state.jobs.values())


def test_a_table_far_slower_than_the_rest_is_strided_by_its_cost() -> None:
    state = pipeline(5, big_cost=4500)
    announced = plan_barrier(state, 26_000, [])
    assert announced is not None
    # 4.5 s against the others' median (0.3 s) or the interval (1 s), whichever is longer: 4.5x,
    # so every 5th barrier (the smallest divisor of the catch-up stride, 10, that covers it)
    assert announced.strides == (TableStride("joined", 5, 4500, 1000),)
    assert Pacer(BarrierConfig()).plan_barrier(state, 26_000, []) == announced


def test_tables_of_like_cost_are_never_strided_however_slow_they_all_are() -> None:
    state = pipeline(5, big_cost=4500, small_cost=4500)
    assert choose_strides(state, live(state), stride_after=3, catchup_stride=10, interval_ms=1000) == ()


def test_a_table_with_nothing_beside_it_is_never_strided() -> None:
    # joined is 15x its root, but no read of another table waits for it: an aggregate over its
    # root alone keeps the clock's pace (striding it would only make its own reads older)
    state = pipeline(5, big_cost=4500)
    chain = [ROOT, BIG, READER]
    assert choose_strides(state, chain, stride_after=3, catchup_stride=10, interval_ms=300) == ()


def test_striding_can_be_turned_off_and_waits_for_three_commits() -> None:
    assert choose_strides(pipeline(5, 4500), live(pipeline(5, 4500)), stride_after=0, catchup_stride=10,
                          interval_ms=1000) == ()
    state = pipeline(2, big_cost=4500)
    assert choose_strides(state, live(state), stride_after=3, catchup_stride=10, interval_ms=1000) == ()


def test_a_stride_is_kept_above_half_the_threshold_and_lifted_below_it() -> None:
    strided = (TableStride("joined", 5, 4500, 1000),)
    kept = pipeline(5, big_cost=2000, strided=strided)  # 2x: below 3x, above 1.5x
    assert choose_strides(kept, live(kept), 3, 10, 1000) == (TableStride("joined", 2, 2000, 1000),)
    lifted = pipeline(5, big_cost=1200, strided=strided)
    assert choose_strides(lifted, live(lifted), 3, 10, 1000) == ()


def test_a_stride_is_kept_while_the_tables_beside_it_fold_their_barriers_and_cost_nothing_measured() -> None:
    strided = (TableStride("joined", 5, 4500, 1000),)

    def folded(state: MetaState) -> MetaState:  # totals caught up after a hold: each barrier folded
        return fold_all([replace(c, started_at_ms=0) for c in state.completions["totals"].values()], state)

    kept = folded(pipeline(5, big_cost=4500, strided=strided))
    assert choose_strides(kept, live(kept), 3, 10, 1000) == (TableStride("joined", 5, 4500, 1000),)
    # a table not strided yet is not strided against tables whose cost is not known
    unknown = folded(pipeline(5, big_cost=4500))
    assert choose_strides(unknown, live(unknown), 3, 10, 1000) == ()


def test_a_strided_job_quiet_past_the_liveness_window_keeps_its_stride() -> None:
    strided = (TableStride("joined", 5, 4500, 1000),)
    state = pipeline(5, big_cost=4500, strided=strided)
    awake = [ROOT, SMALL, READER]  # big's last commit is long past: not live any more
    assert choose_strides(state, awake, 3, 10, 1000) == (TableStride("joined", 5, 4500, 1000),)


def test_a_strided_table_and_its_readers_neither_pace_nor_hold_back_the_clock() -> None:
    strided = (TableStride("joined", 5, 4500, 1000),)
    state = pipeline(5, big_cost=4500, strided=strided)
    assert [j.job_id for j in paced_jobs(state, live(state))] == ["root", "small"]
    assert next_due(state, 25_300) == due_at(state, [ROOT, SMALL], 25_300, 1000) == 26_000
    unstrided = pipeline(5, big_cost=4500)
    assert next_due(unstrided, 25_300) > 26_000  # the clock waits for the slow join
    assert Pacer(BarrierConfig()).next_due(state, 25_300) == 26_000
    # ten barriers on, the join has committed none of them: it holds nothing back
    later = state
    for b in range(6, 11):
        later = fold(later, BarrierAnnounced(b, b * 5000, strides=strided))
        later = fold(later, BarrierCompleted("root", "events", b, 0, b, started_at_ms=b * 5000,
                                             committed_at_ms=b * 5000 + 200))
        later = fold(later, BarrierCompleted("small", "totals", b, 0, b, started_at_ms=b * 5000 + 200,
                                             committed_at_ms=b * 5000 + 500))
    assert plan_barrier(later, 55_000, []) is not None
    assert plan_barrier(replace(later, barriers={**later.barriers, 10: BarrierAnnounced(10, 50_000)}), 55_000,
                        []) is None  # unstrided, the same lag is backpressure


def test_a_strided_root_job_commits_multiples_of_its_stride_and_reads_every_offset_once(
        make_state: Callable[..., MetaState]) -> None:
    every5 = (TableStride("shopping", 5, 4500, 1000),)
    state = make_state(*[BarrierAnnounced(b, 1000 * b, (CutEntry("shopping_source", 0, b * 5),), every5 if b > 3 else ())
                         for b in range(1, 14)], shopping_topology=True)
    job = state.jobs["ingest_shopping"]
    assert ready_barrier(state, job) == 10  # not 13: a batch never ends on a barrier it folds
    work = work_for(state, job, job.resume_barrier, ready_barrier(state, job))
    assert [w.barrier for w in work] == [1, 2, 3, 5, 10]
    ranges = [(start, end) for w in work for (_, _, start, end) in map(astuple, w.offsets)]
    assert ranges[1:] == [(5, 10), (10, 15), (15, 25), (25, 50)]  # contiguous: nothing skipped, nothing twice
    # its readers follow at its exact points
    done = [BarrierCompleted("ingest_shopping", "shopping", w.barrier, 0, w.barrier) for w in work]
    state = make_state(*state.barriers.values(), *done, shopping_topology=True)
    amount = state.jobs["amount_job"]
    assert [w.barrier for w in work_for(state, amount, 0, ready_barrier(state, amount))] == [1, 2, 3, 5, 10]
