"""When the next barrier is due: pacing instead of queueing.

A barrier that waits in a job's queue behind another one adds that whole wait to the delay of
every record it carries. So the clock does not just tick: from the recent completions of each
live job it learns what one barrier costs the job (``cost``: started -> committed) and how long
the job takes to pick up a barrier it could start (``lag``: noticing it, starting the
micro-batch). It then plays the barriers in flight through the job graph and announces the next
barrier at the moment it would reach every job just as that job becomes free. The configured
interval is the shortest spacing; a slow job stretches it to what the job sustains.

>>> from coordinator.domain import BarrierAnnounced, BarrierCompleted, JobState, TableState, fold_all
>>> s = fold_all([TableState("t", "root"), JobState("j", "t", external_topics=("x",))] +
...              [BarrierAnnounced(b, b * 1000) for b in (1, 2)] +
...              [BarrierCompleted("j", "t", 1, 0, 1, started_at_ms=1100, committed_at_ms=2600)])
>>> due_at(s, list(s.jobs.values()), now_ms=2100, interval_ms=500)  # j takes 1.5 s a barrier, 0.1 s to start
4000
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from coordinator.domain.events import BarrierCompleted, JobState
from coordinator.domain.state import MetaState

WINDOW = 20  # barriers of history pacing looks at


@dataclass(frozen=True)
class JobPace:
    """What a barrier costs a job, from its recent completions (medians, in ms)."""

    cost_ms: float = 0.0  # started -> committed
    lag_ms: float = 0.0  # could have started (input ready, previous barrier done) -> started


def completion(state: MetaState, table: str, barrier: int) -> BarrierCompleted | None:
    done = state.completions.get(table, {}).get(barrier)
    return done if done is not None and state.counts(done) else None


def ready_at(state: MetaState, job: JobState, barrier: int) -> int | None:
    """When ``barrier`` reached ``job``: announced (root jobs), or committed by its last source."""
    if not job.sources:
        announced = state.barriers.get(barrier)
        return None if announced is None else announced.ts_ms
    done = [completion(state, s, barrier) for s in job.sources]
    return None if None in done else max(c.committed_at_ms for c in done if c is not None)


Sample = tuple[int, int | None]  # one committed barrier's (cost, lag) in ms; no lag if its input's time is unknown


def window(last: int) -> range:
    """The barriers a pace looks at, ending at ``last``."""
    return range(max(1, last - WINDOW), last + 1)


def pace_sample(state: MetaState, job: JobState, barrier: int) -> Sample | None:
    """``job``'s cost and lag at ``barrier`` (None: it did not commit it, or gave no start time)."""
    done = completion(state, job.sink, barrier)
    if done is None or not done.started_at_ms:
        return None
    ready = ready_at(state, job, barrier)
    if ready is None:
        return done.committed_at_ms - done.started_at_ms, None
    before = completion(state, job.sink, barrier - 1)
    could_start = max(ready, before.committed_at_ms if before is not None else 0)
    return done.committed_at_ms - done.started_at_ms, max(0, done.started_at_ms - could_start)


def pace_of(samples: Iterable[Sample]) -> JobPace:
    """The medians of ``samples``."""
    costs, lags = [], []
    for cost, lag in samples:
        costs.append(cost)
        if lag is not None:
            lags.append(lag)
    return JobPace(statistics.median(costs) if costs else 0.0, statistics.median(lags) if lags else 0.0)


def job_pace(state: MetaState, job: JobState, last: int) -> JobPace:
    """``job``'s cost and lag over the barriers it committed among the ``WINDOW`` up to ``last``."""
    return pace_of(s for b in window(last) if (s := pace_sample(state, job, b)) is not None)


def committed_through(state: MetaState, job: JobState, last: int) -> int | None:
    """The newest barrier in the window that ``job`` committed (None: none in the window)."""
    for b in range(last, max(0, last - WINDOW) - 1, -1):
        if completion(state, job.sink, b) is not None:
            return b
    return None


def due_at(state: MetaState, jobs: Sequence[JobState], now_ms: int, interval_ms: int) -> int:
    """Epoch ms at which the next barrier should be announced: ``interval_ms`` after the last
    one, and late enough that it reaches each of ``jobs`` (the live ones) no sooner than the job
    is done with the barriers already in flight. Planned from scratch: the leader keeps a
    ``coordinator.domain.pacer.Pacer`` that gives the same, replanning only what changed."""
    last = state.last_barrier()
    announced = state.barriers.get(last)
    earliest = (announced.ts_ms if announced is not None else 0) + interval_ms
    writers = {j.sink: j for j in jobs}
    through = {j.job_id: committed_through(state, j, last) for j in jobs}
    # a pace looks back from the job's newest commit, so announcing a barrier leaves it be
    pace = {j.job_id: job_pace(state, j, through[j.job_id] or last) for j in jobs}
    finish: dict[str, dict[int, float]] = {}  # job -> barrier -> when it is (estimated to be) committed
    path: dict[str, float] = {}  # job -> from announcing a barrier to the job starting it, nothing queued
    due = float(earliest)
    for job in upstream_first(jobs):
        cost, lag = pace[job.job_id].cost_ms, pace[job.job_id].lag_ms
        upstream = [writers[s] for s in job.sources if s in writers]
        if len(upstream) < len(job.sources) or any(u.job_id not in path for u in upstream):
            continue  # a source has no live writer (here or upstream): no new barrier reaches this job
        path[job.job_id] = lag + max((path[u.job_id] + pace[u.job_id].cost_ms for u in upstream), default=0.0)
        newest = through[job.job_id]
        done = completion(state, job.sink, newest) if newest is not None else None
        free = float(done.committed_at_ms) if done is not None else 0.0
        finish[job.job_id] = {}
        for b in range((newest or job.resume_barrier) + 1, last + 1):
            arrive = _arrival(state, job, b, upstream, finish)
            if arrive is None:
                break  # not announced (or an upstream job dropped it): nothing more to play
            free = max(max(arrive + lag, free) + cost, float(now_ms))
            finish[job.job_id][b] = free
        due = max(due, free - path[job.job_id])
    return int(due)


def _arrival(state: MetaState, job: JobState, barrier: int, upstream: list[JobState],
             finish: dict[str, dict[int, float]]) -> float | None:
    """When ``barrier`` reaches ``job`` (actual, or estimated from its upstream jobs)."""
    if not job.sources:
        announced = state.barriers.get(barrier)
        return None if announced is None else float(announced.ts_ms)
    times = []
    for writer in upstream:
        done = completion(state, writer.sink, barrier)
        at = float(done.committed_at_ms) if done is not None else finish.get(writer.job_id, {}).get(barrier)
        if at is None:
            return None
        times.append(at)
    return max(times)


def upstream_first(jobs: Sequence[JobState]) -> list[JobState]:
    """``jobs`` with every job after the writers of its sources (the job graph has no cycles)."""
    writers = {j.sink: j for j in jobs}
    order: list[JobState] = []
    placed: set[str] = set()

    def place(job: JobState) -> None:
        if job.job_id in placed:
            return
        placed.add(job.job_id)
        for source in job.sources:
            if source in writers:
                place(writers[source])
        order.append(job)

    for job in sorted(jobs, key=lambda j: j.job_id):
        place(job)
    return order
