"""JSON bodies of the REST API, computed from MetaState (no Faust here, so tests call them)."""

from __future__ import annotations

from typing import Any

from coordinator.domain import MetaState
from coordinator.domain.delays import delay_report
from coordinator.domain.events import JobStatus
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


def metrics(state: MetaState, counters: dict[str, int], now_ms: int, liveness_ms: int) -> str:
    """Prometheus text exposition."""
    lines = [
        "# HELP lockstep_last_barrier Newest announced barrier id.",
        "# TYPE lockstep_last_barrier gauge",
        f"lockstep_last_barrier {state.last_barrier()}",
        "# HELP lockstep_state_records Records of the coordinator's state (pruning keeps it bounded).",
        "# TYPE lockstep_state_records gauge",
        f"lockstep_state_records {state.records()}",
        "# HELP lockstep_job_stalled 1 while a RUNNING job is silent past the liveness window (STALLED).",
        "# TYPE lockstep_job_stalled gauge",
        *(f'lockstep_job_stalled{{job="{j}"}} {int(state.status_of(job, now_ms, liveness_ms) == JobStatus.STALLED)}'
          for j, job in sorted(state.jobs.items()) if job.status == JobStatus.RUNNING),
        "# HELP lockstep_barrier_lag Announced barriers not yet an exact point of the table.",
        "# TYPE lockstep_barrier_lag gauge",
    ]
    report = delay_report(state)
    d = report["tables"]
    lines += [f'lockstep_barrier_lag{{table="{t}"}} {v["lag_barriers"]}' for t, v in d.items()]
    lines += ["# HELP lockstep_e2e_delay_ms Commit time minus barrier time over the last 100 exact points.",
              "# TYPE lockstep_e2e_delay_ms gauge"]
    lines += [f'lockstep_e2e_delay_ms{{table="{t}",quantile="{q}"}} {v[f"e2e_p{q[2:]}_ms"]}'
              for t, v in d.items() for q in ("0.50", "0.99") if v["e2e_p50_ms"] is not None]
    lines += ["# HELP lockstep_job_delay_ms A job's own delay (its commit minus its latest source's commit).",
              "# TYPE lockstep_job_delay_ms gauge"]
    lines += [f'lockstep_job_delay_ms{{job="{j}",quantile="{q}"}} {v[f"own_p{q[2:]}_ms"]}'
              for j, v in report["jobs"].items() for q in ("0.50", "0.99") if v["own_p50_ms"] is not None]
    for name, value in sorted(counters.items()):
        lines += [f"# TYPE lockstep_{name} counter", f"lockstep_{name}_total {value}"]
    return "\n".join(lines) + "\n"
