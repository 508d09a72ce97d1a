"""How late each table and job is (docs/concepts.md: how late is the data?), computed from the state.

E2E delay of table X at barrier b = committed_at(X, b) - ts(b). A job's own delay at b =
committed_at(sink, b) - max(committed_at(source, b)) (root jobs: - ts(b)). The bottleneck is
the job with the largest own delay upstream of the table with the largest E2E delay.

Staleness is what a reader feels: at time t a read-committed read of X sees the newest
barrier X has committed by t, and everything produced before that barrier's time; staleness(t)
= t - ts(that barrier). It grows between two commits and drops at each, so E2E alone (the
drop) understates it by up to one barrier interval; the report gives its time-weighted p50 and
p99 between the first and the last of the recent commits.

>>> from coordinator.domain import BarrierAnnounced, BarrierCompleted, TableState, fold_all
>>> s = fold_all([TableState("t", "root"), BarrierAnnounced(1, 1000), BarrierCompleted("j", "t", 1, 0, 3, committed_at_ms=1400)])
>>> delay_report(s)["tables"]["t"]["e2e_p50_ms"]
400
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from coordinator.domain.events import CutEntry
from coordinator.domain.state import MetaState

N = TypeVar("N", int, float)


def percentile(values: Sequence[N], p: float) -> N | None:
    """Nearest-rank percentile; None for no values.

    >>> percentile([5, 1, 3, 2, 4], 0.5), percentile([5, 1, 3, 2, 4], 0.99), percentile([], 0.5)
    (3, 5, None)
    """
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, -(-int(p * 1000) * len(ordered) // 1000) - 1))]


def staleness(commits: list[tuple[int, int]], samples: int = 1000) -> list[int]:
    """Staleness sampled at ``samples`` evenly spaced instants from the first commit to the last;
    ``commits`` are (committed_at_ms, barrier ts_ms) of one table's barriers in barrier order.

    >>> staleness([(1500, 1000), (2500, 2000)], samples=4)  # 0.5 s right after a commit, 1.5 s just before the next
    [500, 750, 1000, 1250]
    """
    ordered = sorted(commits)
    if len(ordered) < 2:
        return []
    start, end = ordered[0][0], ordered[-1][0]
    out, i = [], 0
    for k in range(samples):
        t = start + (end - start) * k // samples
        while i + 1 < len(ordered) and ordered[i + 1][0] <= t:
            i += 1
        out.append(t - ordered[i][1])
    return out


def _committed(state: MetaState, table: str) -> dict[int, int]:
    """barrier -> committed_at_ms of the completions of ``table`` that count (its exact points)."""
    by_b = state.completions.get(table, {})
    return {b: by_b[b].committed_at_ms for b in state.exact_points(table)}


def delay_report(state: MetaState, last: int = 100, since_ms: int | None = None) -> dict[str, Any]:
    """Per table and per job: latest exact barrier, lag, delay p50/p99 over the last ``last``
    exact barriers (announced at or after ``since_ms``, if given: one run's figures, not the
    hours a stopped pipeline waited), the table's writer and the job's status (ended jobs stay
    listed); and the bottleneck among the running jobs.

    >>> from coordinator.domain import BarrierAnnounced, BarrierCompleted, TableState, fold_all
    >>> s = fold_all([TableState("t", "root"), BarrierAnnounced(1, 1000), BarrierAnnounced(2, 9000),
    ...               BarrierCompleted("j", "t", 1, 0, 3, committed_at_ms=1400),
    ...               BarrierCompleted("j", "t", 2, 0, 5, committed_at_ms=9100)])
    >>> delay_report(s)["tables"]["t"]["e2e_p99_ms"], delay_report(s, since_ms=5000)["tables"]["t"]["e2e_p99_ms"]
    (400, 100)
    """
    newest = state.last_barrier()

    def recent(barriers: Iterable[int]) -> list[int]:
        return sorted(b for b in barriers if b in state.barriers
                      and (since_ms is None or state.barriers[b].ts_ms >= since_ms))[-last:]

    committed_of = {name: _committed(state, name) for name in state.tables}
    tables: dict[str, Any] = {}
    for name in sorted(state.tables):
        committed = committed_of[name]
        window = recent(committed)
        e2e = [committed[b] - state.barriers[b].ts_ms for b in window]
        stale = staleness([(committed[b], state.barriers[b].ts_ms) for b in window])
        latest = max(committed, default=None)
        writer = state.writer_of(name)
        tables[name] = {"latest_exact_barrier": latest, "lag_barriers": newest - (latest or 0),
                        "e2e_p50_ms": percentile(e2e, 0.5), "e2e_p99_ms": percentile(e2e, 0.99),
                        "e2e_last_ms": e2e[-1] if e2e else None, "staleness_p50_ms": percentile(stale, 0.5),
                        "staleness_p99_ms": percentile(stale, 0.99), "writer": writer.job_id if writer else None}
    jobs: dict[str, Any] = {}
    for job in sorted(state.jobs.values(), key=lambda j: j.job_id):
        sink = committed_of.get(job.sink) or _committed(state, job.sink)
        sources = [committed_of.get(s) or _committed(state, s) for s in job.sources]
        own = []
        phases: dict[str, list[int]] = {}
        for b in recent(sink):
            for phase in state.completions[job.sink][b].phases:
                phases.setdefault(phase.name, []).append(phase.ms)
            if not job.sources:
                own.append(sink[b] - state.barriers[b].ts_ms)
            elif all(b in s for s in sources):
                own.append(sink[b] - max(s[b] for s in sources))
        jobs[job.job_id] = {"sink": job.sink, "status": job.status, "own_p50_ms": percentile(own, 0.5),
                            "own_p99_ms": percentile(own, 0.99),
                            "phases_p50_ms": {name: percentile(ms, 0.5) for name, ms in phases.items()}}
    return {"tables": tables, "jobs": jobs, "bottleneck": _bottleneck(state, tables, jobs)}


def _bottleneck(state: MetaState, tables: dict[str, Any], jobs: dict[str, Any]) -> str | None:
    maintained = [t for t in tables if tables[t]["e2e_p50_ms"] is not None and tables[t]["writer"] is not None]
    slowest = max(maintained, key=lambda t: tables[t]["e2e_p50_ms"], default=None)
    if slowest is None:
        return None
    upstream: set[str] = set()
    frontier = [slowest]
    while frontier:
        table = frontier.pop()
        writer = state.writer_of(table)
        if writer is not None and writer.job_id not in upstream:
            upstream.add(writer.job_id)
            frontier.extend(writer.sources)
    candidates = [j for j in upstream if j in jobs and jobs[j]["own_p50_ms"] is not None]
    return max(candidates, key=lambda j: (jobs[j]["own_p50_ms"], j), default=None)


def kafka_backlog(state: MetaState, ends: Iterable[CutEntry]) -> dict[str, int]:
    """Per root table with a running job: records in its topics (``ends``: each partition's end
    offset now) past where its newest exact point's reading ended (its completion's ranges, else
    that barrier's cut), i.e. what its job still has to read; from offset 0 before any.

    >>> from coordinator.domain import BarrierCompleted, JobState, TableState, fold_all
    >>> from coordinator.domain.events import OffsetRange
    >>> s = fold_all([TableState("t", "root"), JobState("j", "t", external_topics=("x",)),
    ...               BarrierCompleted("j", "t", 1, 0, 3, source_offsets=(OffsetRange("x", 0, 0, 40),))])
    >>> kafka_backlog(s, [CutEntry("x", 0, 100), CutEntry("x", 1, 5)])
    {'t': 65}
    """
    by_topic: dict[str, list[CutEntry]] = {}
    for end in ends:
        by_topic.setdefault(end.topic, []).append(end)
    out: dict[str, int] = {}
    for job in state.active_jobs():
        if not job.external_topics:
            continue
        read_to: dict[tuple[str, int], int] = {}
        newest = state.latest_exact(job.sink)
        done = state.completions.get(job.sink, {}).get(newest) if newest is not None else None
        for cut in state.barriers[newest].cut if newest in state.barriers else ():
            read_to[(cut.topic, cut.partition)] = cut.offset
        for part in done.source_offsets if done is not None else ():
            read_to[(part.topic, part.partition)] = part.end
        out[job.sink] = sum(max(0, end.offset - read_to.get((end.topic, end.partition), 0))
                            for topic in job.external_topics for end in by_topic.get(topic, ()))
    return out
