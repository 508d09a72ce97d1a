"""Pacing: the next barrier is announced when it would reach every job just as the job is free."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from coordinator.domain import (
    BarrierAnnounced,
    BarrierCompleted,
    JobState,
    MetaState,
    TableState,
    TableStride,
    fold_all,
)
from coordinator.domain.barriers import BarrierConfig, next_due, plan_barrier
from coordinator.domain.events import GenerationStart, JobStatus
from coordinator.domain.pacer import Pacer
from coordinator.domain.pacing import JobPace, committed_through, due_at, job_pace
from coordinator.domain.pruning import prunable
from coordinator.domain.strides import paced_jobs

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


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_the_leaders_pacer_never_changes_a_plan(seed: int) -> None:
    """Replanning what changed with the ``Pacer`` the leader keeps gives what planning from
    scratch gives, fact by fact and at ticks in between, through commits out of step, revisions
    that recompute old barriers, pruning, renewals, jobs that stop or fall silent, and strides."""
    rng = random.Random(seed)
    tables = {"events": None, "totals": "events", "top": "totals", "other": None}
    jobs = {t: JobState(f"j_{t}", t, sources=(s,) if s else (), external_topics=() if s else ("x",))
            for t, s in tables.items()}
    state = fold_all([TableState(t, "root" if s is None else "derived") for t, s in tables.items()]
                     + list(jobs.values()))  # type: ignore[arg-type]
    config = BarrierConfig(interval_ms=500, max_inflight=4, liveness_ms=3000)
    pacer = Pacer(config)
    done: dict[str, int] = dict.fromkeys(tables, 0)
    now = 0
    for step in range(600):
        now += rng.randint(10, 400)
        roll = rng.random()
        last = state.last_barrier()
        if roll < 0.25:
            # now and then a barrier strides a table (and so its readers) or lifts it
            strides = rng.choice([(), (), (TableStride("totals", 2, 0, 0),), (TableStride("other", 5, 0, 0),)])
            facts: list[object] = [BarrierAnnounced(last + 1, now, strides=strides)]
        elif roll < 0.85:
            ready = [t for t, s in tables.items() if done[t] < (done[s] if s else last)]
            if not ready:
                continue
            t = rng.choice(ready)
            done[t] += 1
            started = now - rng.randint(50, 2000)
            facts = [BarrierCompleted(jobs[t].job_id, t, done[t], state.tables[t].generation, done[t] + 7,
                                      started_at_ms=started, committed_at_ms=now)]
        elif roll < 0.9 and done["totals"] > 3:  # revise totals from an earlier barrier: old barriers recomputed
            table = state.tables["totals"]
            start = rng.randint(1, done["totals"] - 1)
            generation = table.generation + 1
            facts = [replace(table, generation=generation,
                             generations=(*table.generations, GenerationStart(generation, start)))]
            done["totals"] = done["top"] = start
        elif roll < 0.93:
            facts = list(prunable(state, 5))
        elif roll < 0.96:
            job = state.jobs[rng.choice(sorted(state.jobs))]
            facts = [replace(job, updated_at_ms=now)]  # a renewal
        else:
            job = jobs["other"]
            jobs["other"] = replace(job, status=JobStatus.FINISHED if job.status == JobStatus.RUNNING else JobStatus.RUNNING)
            facts = [jobs["other"]]
        state = fold_all(facts, state)  # type: ignore[arg-type]
        for tick in (now, now + rng.randint(1, 1500)):  # a tick right after the facts, and one later
            now = tick  # the leader's clock does not go back
            assert pacer.next_due(state, tick) == next_due(state, tick, config), f"step {step}: {facts}"
            assert pacer.plan_barrier(state, tick, []) == plan_barrier(state, tick, [], config)
            last = state.last_barrier()
            assert pacer.paces() == {j.job_id: job_pace(state, j, committed_through(state, j, last) or last)
                                     for j in paced_jobs(state, state.live_jobs(tick, config.liveness_ms))}, \
                f"step {step}: {facts}"


def test_a_job_two_hops_below_a_silent_root_does_not_pace_the_clock() -> None:
    """root -> mid -> leaf with the root's job fallen silent: neither mid nor leaf can get a new
    barrier, so they hold nothing back (and the plan does not fail on the missing link)."""
    state = fold_all([TableState("a", "root"), TableState("b", "derived"), TableState("c", "derived"),
                      JobState("ja", "a", external_topics=("x",)), JobState("jb", "b", sources=("a",)),
                      JobState("jc", "c", sources=("b",)), BarrierAnnounced(1, 1000)])
    live = [state.jobs["jb"], state.jobs["jc"]]
    assert due_at(state, live, now_ms=1200, interval_ms=500) == 1500
