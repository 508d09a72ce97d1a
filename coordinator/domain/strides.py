"""Strides: a table far slower than the rest commits every k-th barrier, so it does not age every read.

The clock paces barriers to its slowest live job (``pacing``): one table much slower than the
others (a large join among small aggregates) would stretch every barrier, and so every read, to
its pace. Instead the leader names such a table in the barriers it announces, with a stride k
(``TableStride``): the table commits only barriers that are multiples of k (``work``: the job
folds the barriers between into the next multiple, as a lagging job folds its), and neither it
nor the tables that read it pace or hold back the clock (``paced_jobs``). A read that joins it
finds an exact point every k barriers; a read of the other tables finds one every barrier.

The slowest table is strided when the median cost of its commits (started -> committed) is
more than ``stride_after`` times the reference: the configured interval, or the cost of the
slowest table beside it if that is longer (neither upstream nor downstream of it: the tables
whose reads it would otherwise hold back; a strided table keeps being weighed against the
interval while those fold their barriers into commits too quick to measure); then the next
slowest is weighed the same way. A table with nothing beside it (an aggregate over its root
alone) is never strided, nor are tables of like cost (siblings over one root), however slow
they all are: only an outlier is.
k is the smallest divisor of the catch-up stride that covers the ratio (strided tables and
lagging jobs then meet at its multiples, and a read joining several strided tables finds common
points); the stride is lifted once the ratio falls below half of ``stride_after``.

Example::

    >>> from coordinator.domain import BarrierAnnounced, BarrierCompleted, JobState, TableState, fold_all
    >>> jobs = [JobState("ingest", "r", external_topics=("x",)), JobState("big", "slow", sources=("r",)),
    ...         JobState("agg", "fast", sources=("r",))]
    >>> facts = [TableState("r", "root"), TableState("slow", "derived"), TableState("fast", "derived"), *jobs]
    >>> for b in range(1, 6):
    ...     facts += [BarrierAnnounced(b, b * 1000)] + [
    ...         BarrierCompleted(j, t, b, 0, b, started_at_ms=b * 1000, committed_at_ms=b * 1000 + ms)
    ...         for j, t, ms in (("ingest", "r", 100), ("big", "slow", 4500), ("agg", "fast", 300))]
    >>> state = fold_all(facts)
    >>> choose_strides(state, jobs, stride_after=3, catchup_stride=10, interval_ms=1000)
    (TableStride(table='slow', every=5, cost_ms=4500, reference_ms=1000),)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from coordinator.domain.events import JobState, JobStatus, TableStride
from coordinator.domain.pacing import WINDOW
from coordinator.domain.state import MetaState

MIN_SAMPLES = 3  # commits a table's cost is measured over before it is strided


def strides_at(state: MetaState, barrier: int) -> dict[str, TableStride]:
    """The strides announced with ``barrier`` (none if it is not known)."""
    announced = state.barriers.get(barrier)
    return {} if announced is None else {s.table: s for s in announced.strides}


def stride_of(state: MetaState, table: str, barrier: int) -> int:
    """Every how many barriers ``table`` commits at ``barrier`` (1: every one)."""
    stride = strides_at(state, barrier).get(table)
    return 1 if stride is None else stride.every


def commits_at(state: MetaState, table: str, barrier: int) -> bool:
    """Whether ``table`` commits ``barrier``: it is a multiple of the table's stride there."""
    return barrier % stride_of(state, table, barrier) == 0


def commit_point(state: MetaState, table: str, barrier: int, floor: int = 0) -> int:
    """The newest barrier at or before ``barrier`` (and above ``floor``, else ``floor``) that
    ``table`` commits."""
    while barrier > floor and not commits_at(state, table, barrier):
        barrier -= 1
    return max(barrier, floor)


def paced_jobs(state: MetaState, live: Sequence[JobState]) -> list[JobState]:
    """``live`` without the jobs of strided tables (as of the newest barrier) and the jobs that
    read them, at any depth: these follow at the strided tables' multiples and hold nothing back."""
    strided = set(strides_at(state, state.last_barrier()))
    if not strided:
        return list(live)
    above = ancestors(live)
    return [j for j in live if not ({j.sink} | above[j.sink]) & strided]


def commit_costs(state: MetaState, job: JobState, last: int, every: int) -> list[int]:
    """The costs (ms, started -> committed) of ``job``'s commits that took time among the last
    ``WINDOW`` of its commit points up to ``last`` (``every``: its stride now); a barrier folded
    into a batch's commit took none of its own."""
    by_barrier = state.completions.get(job.sink, {})
    out = []
    for b in range(last, max(0, last - WINDOW * every), -1):
        done = by_barrier.get(b)
        if done is not None and done.started_at_ms and done.committed_at_ms > done.started_at_ms:  # a voided one took time too
            out.append(done.committed_at_ms - done.started_at_ms)
    return out


def ancestors(live: Sequence[JobState]) -> dict[str, set[str]]:
    """Table of each ``live`` job -> the tables it reads, at any depth through live jobs' tables."""
    up: dict[str, set[str]] = {j.sink: set(j.sources) for j in live}

    def walk(table: str, seen: set[str]) -> set[str]:
        for source in up.get(table, ()):
            if source not in seen:  # (also what keeps a malformed graph with a cycle finite)
                seen.add(source)
                walk(source, seen)
        return seen

    return {t: walk(t, set()) for t in up}


def relatives(live: Sequence[JobState]) -> dict[str, set[str]]:
    """Table -> the tables upstream or downstream of it (at any depth) among ``live`` jobs' tables."""
    lineage = ancestors(live)
    for table, above in list(lineage.items()):
        for source in above:
            lineage.setdefault(source, set()).add(table)
    return lineage


def choose_strides(state: MetaState, live: Sequence[JobState], stride_after: int, catchup_stride: int,
                   interval_ms: int) -> tuple[TableStride, ...]:
    """The strides of the next barrier (see the module); ``stride_after`` 0: none."""
    if stride_after <= 0 or catchup_stride < 2:
        return ()
    last = state.last_barrier()
    now = strides_at(state, last)
    # a strided job is silent between its commits, longer than the liveness window at a long
    # stride: it keeps its stride while it runs, else it would lose it for being quiet
    quiet = [j for j in state.active_jobs() if j.status == JobStatus.RUNNING and j.sink in now and j not in live]
    live = [*live, *quiet]
    costs: dict[str, float] = {}
    for job in live:
        stride = now.get(job.sink)
        samples = commit_costs(state, job, last, stride.every if stride is not None else 1)
        if len(samples) >= (1 if stride is not None else MIN_SAMPLES):
            costs[job.sink] = statistics.median(samples)
    divisors = [d for d in range(2, catchup_stride + 1) if catchup_stride % d == 0]
    related = relatives(live)
    out: list[TableStride] = []
    for table, cost in sorted(costs.items(), key=lambda item: (-item[1], item[0])):
        # what it would keep up with: tables neither above nor below it, not strided (a table
        # with none, such as an aggregate over its root alone, holds no other read back)
        skip = {table, *related.get(table, ()), *(s.table for s in out)}
        if not any(j.sink not in skip for j in live):
            continue
        # the tables beside it too quick to measure (their barriers folded into few commits while
        # they caught up after a hold) keep the stride it has: it is weighed against the clock
        beside = [c for t, c in costs.items() if t not in skip]
        if not beside and table not in now:
            continue
        reference = max(float(interval_ms), *beside, 1.0)
        ratio = cost / reference
        if not (ratio > stride_after or (table in now and ratio >= stride_after / 2)):
            break
        every = next((d for d in divisors if d >= ratio), catchup_stride)
        out.append(TableStride(table, every, round(cost), round(reference)))
    return tuple(sorted(out, key=lambda s: s.table))
