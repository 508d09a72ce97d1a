"""JSON bodies of the REST API, computed from MetaState (no Faust here, so tests call them)."""

from __future__ import annotations

from typing import Any

from coordinator.domain import MetaState
from coordinator.domain.delays import delay_report
from coordinator.domain.records import to_record


def topology(state: MetaState, now_ms: int, liveness_ms: int) -> dict[str, Any]:
    """Tables in the catalog (CTAS tables not yet created are listed under ``pending`` only); a
    job's status is STALLED when it is RUNNING but silent past the liveness window."""
    return {
        "tables": {n: {"kind": (t := state.tables[n]).kind, "writer": t.writer, "generation": t.generation}
                   for n in state.catalog()},
        "pending": state.pending(),
        "jobs": {
            j: {"sink": s.sink, "sources": list(s.sources), "external_topics": list(s.external_topics),
                "status": state.status_of(s, now_ms, liveness_ms)}
            for j, s in sorted(state.jobs.items())
        },
        "edges": [list(e) for e in state.edges()],
    }


def table(state: MetaState, name: str) -> dict[str, Any] | None:
    t = state.tables.get(name)
    if t is None or not state.created(name):
        return None
    points = state.exact_points(name)
    return {
        **to_record(t),
        "exact_points": {str(b): v for b, v in sorted(points.items())},
        "latest_exact_barrier": max(points, default=None),
    }


def barriers(state: MetaState, start: int, limit: int) -> list[dict[str, Any]]:
    ids = sorted(b for b in state.barriers if b >= start)[:limit]
    return [to_record(state.barriers[b]) for b in ids]


def delays(state: MetaState, now_ms: int, liveness_ms: int, last: int = 100, since_ms: int | None = None) -> dict[str, Any]:
    """Per table and job: latest exact barrier, lag, delay p50/p99 over the last barriers; the
    bottleneck; each job's status as ``topology`` shows it."""
    report = delay_report(state, last, since_ms)
    for job_id, job in report["jobs"].items():
        job["status"] = state.status_of(state.jobs[job_id], now_ms, liveness_ms)
    return report
