"""The barrier clock's pure decision: ids continue, timestamps never go back, backpressure."""

from __future__ import annotations

from collections.abc import Callable

from coordinator.domain import (
    BarrierAnnounced,
    BarrierCompleted,
    CutEntry,
    DeclareTable,
    MetaState,
    RegisterJob,
    fold_all,
)
from coordinator.domain.barriers import BarrierConfig, plan_barrier

MakeState = Callable[..., MetaState]


def test_ids_continue_from_state_and_cut_is_sorted() -> None:
    state = fold_all([BarrierAnnounced(41, 5_000)])
    cut = [CutEntry("b", 1, 9), CutEntry("a", 0, 3), CutEntry("b", 0, 7)]
    barrier = plan_barrier(state, now_ms=6_000, cut=cut)
    assert barrier == BarrierAnnounced(42, 6_000, (CutEntry("a", 0, 3), CutEntry("b", 0, 7), CutEntry("b", 1, 9)))


def test_timestamps_never_go_backwards_on_a_leader_with_a_slow_clock() -> None:
    state = fold_all([BarrierAnnounced(3, 9_000)])
    assert plan_barrier(state, now_ms=8_000, cut=[]).ts_ms == 9_000


def test_backpressure_holds_barriers_while_a_live_job_is_behind(make_state: MakeState) -> None:
    config = BarrierConfig(max_inflight=2, liveness_ms=30_000)
    state = make_state(shopping_topology=True, now_ms=0)  # jobs start at barrier 0
    for b in (1, 2):
        state = fold_all([BarrierAnnounced(b, b)], state)
    assert plan_barrier(state, now_ms=10, cut=[], config=config).barrier == 3
    state = fold_all([BarrierAnnounced(3, 3)], state)
    assert plan_barrier(state, now_ms=10, cut=[], config=config) is None  # 3 in flight > 2
    done = [BarrierCompleted(j, t, 1, 0, 1, committed_at_ms=10) for j, t in
            [("ingest_shopping", "shopping"), ("amount_job", "user_item_amount"), ("price_job", "user_item_price")]]
    state = fold_all(done, state)
    assert plan_barrier(state, now_ms=10, cut=[], config=config).barrier == 4


def test_a_dead_job_stops_holding_barriers_back(make_state: MakeState) -> None:
    config = BarrierConfig(max_inflight=1, liveness_ms=1_000)
    state = make_state(shopping_topology=True, now_ms=0)
    state = fold_all([BarrierAnnounced(b, b) for b in (1, 2, 3)], state)
    assert plan_barrier(state, now_ms=500, cut=[], config=config) is None
    # silent for the window since barrier 1 (at 1 ms), which it owes
    assert plan_barrier(state, now_ms=1_002, cut=[], config=config).barrier == 4


def test_a_job_with_nothing_to_commit_is_waiting_not_dead_however_long_the_clock_is_held(
        make_state: MakeState) -> None:
    config = BarrierConfig(max_inflight=1, liveness_ms=1_000)
    state = make_state(shopping_topology=True, now_ms=0)
    state = fold_all([BarrierAnnounced(1, 1)], state)
    done = fold_all([BarrierCompleted(j.job_id, j.sink, 1, 0, 1, started_at_ms=2, committed_at_ms=3)
                     for j in state.jobs.values() if j.sink != "user_item_price"], state)
    # the others are done with barrier 1 and wait while user_item_price holds the clock: a minute
    # later they are still live (pacing and strides weigh them), and it is not
    live = {j.sink for j in done.live_jobs(now_ms=60_000, liveness_ms=config.liveness_ms)}
    assert live == {j.sink for j in state.jobs.values()} - {"user_item_price"}
    assert {done.status_of(j, 60_000, config.liveness_ms) for j in done.jobs.values() if j.sink != "user_item_price"} \
        == {"RUNNING"}
    assert done.status_of(done.jobs[next(j for j, s in done.jobs.items() if s.sink == "user_item_price")], 60_000,
                          config.liveness_ms) == "STALLED"


def test_jobs_registered_later_only_count_barriers_after_their_start(make_state: MakeState) -> None:
    config = BarrierConfig(max_inflight=1)
    state = make_state(*(BarrierAnnounced(b, b) for b in range(1, 10)), shopping_topology=True, now_ms=0)
    # The topology registered before barrier 1 and never committed: it holds the clock.
    assert plan_barrier(state, now_ms=0, cut=[], config=config) is None
    late = make_state(
        *(BarrierAnnounced(b, b) for b in range(1, 10)),
        DeclareTable("a", "t", "root"),
        RegisterJob("b", "j", "t", external_topics=("s",)),
        now_ms=0,
    )
    assert late.jobs["j"].start_barrier == 9
    assert plan_barrier(late, now_ms=0, cut=[], config=config).barrier == 10


def test_a_job_creating_its_ctas_table_holds_no_barrier_back(make_state: MakeState) -> None:
    config = BarrierConfig(max_inflight=1)
    creating = [DeclareTable("s", "src", "root"), DeclareTable("a", "totals", "intermediate", ctas=True),
                RegisterJob("b", "maintain_totals", "totals", sources=("src",))]
    state = make_state(*creating, *(BarrierAnnounced(b, b) for b in (1, 2, 3)), now_ms=0)
    assert plan_barrier(state, now_ms=0, cut=[], config=config).barrier == 4  # its first commit covers them all
    state = fold_all([BarrierCompleted("maintain_totals", "totals", 1, 0, 0, committed_at_ms=0)], state)
    assert plan_barrier(state, now_ms=0, cut=[], config=config) is None  # created: now it does
