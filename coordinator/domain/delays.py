"""How late each table and job is (DESIGN.md "Delay and lineage"), computed from the state.

E2E delay of table X at barrier b = committed_at(X, b) - ts(b). A job's own delay at b =
committed_at(sink, b) - max(committed_at(source, b)) (root jobs: - ts(b)). The bottleneck is
the job with the largest own delay upstream of the table with the largest E2E delay.

>>> from coordinator.domain import BarrierAnnounced, BarrierCompleted, TableState, fold_all
>>> s = fold_all([TableState("t", "root"), BarrierAnnounced(1, 1000), BarrierCompleted("j", "t", 1, 0, 3, committed_at_ms=1400)])
>>> delay_report(s)["tables"]["t"]["e2e_p50_ms"]
400
"""

from __future__ import annotations

from typing import Any

from coordinator.domain.state import MetaState


def percentile(values: list[int], p: float) -> int | None:
    """Nearest-rank percentile; None for no values.

    >>> percentile([5, 1, 3, 2, 4], 0.5), percentile([5, 1, 3, 2, 4], 0.99), percentile([], 0.5)
    (3, 5, None)
    """
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, -(-int(p * 1000) * len(ordered) // 1000) - 1))]


def _committed(state: MetaState, table: str) -> dict[int, int]:
    """barrier -> committed_at_ms of the completions of ``table`` that count."""
    return {b: c.committed_at_ms for b, c in state.completions.get(table, {}).items() if state.counts(c)}


def delay_report(state: MetaState, last: int = 100) -> dict[str, Any]:
    """Per table and per job: latest exact barrier, lag, delay p50/p99 over the last ``last``
    exact barriers, the table's writer and the job's status (ended jobs stay listed); and the
    bottleneck among the running jobs."""
    newest = state.last_barrier()
    tables: dict[str, Any] = {}
    for name in sorted(state.tables):
        committed = _committed(state, name)
        recent = sorted(b for b in committed if b in state.barriers)[-last:]
        e2e = [committed[b] - state.barriers[b].ts_ms for b in recent]
        latest = max(committed, default=None)
        writer = state.writer_of(name)
        tables[name] = {"latest_exact_barrier": latest, "lag_barriers": newest - (latest or 0),
                        "e2e_p50_ms": percentile(e2e, 0.5), "e2e_p99_ms": percentile(e2e, 0.99),
                        "e2e_last_ms": e2e[-1] if e2e else None, "writer": writer.job_id if writer else None}
    jobs: dict[str, Any] = {}
    for job in sorted(state.jobs.values(), key=lambda j: j.job_id):
        sink = _committed(state, job.sink)
        sources = [_committed(state, s) for s in job.sources]
        own = []
        for b in sorted(sink)[-last:]:
            if job.sources:
                if all(b in s for s in sources):
                    own.append(sink[b] - max(s[b] for s in sources))
            elif b in state.barriers:
                own.append(sink[b] - state.barriers[b].ts_ms)
        jobs[job.job_id] = {"sink": job.sink, "status": job.status, "own_p50_ms": percentile(own, 0.5),
                            "own_p99_ms": percentile(own, 0.99)}
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
