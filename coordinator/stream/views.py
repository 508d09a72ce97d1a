"""JSON bodies of the REST API, computed from MetaState (no Faust here, so tests call them)."""

from __future__ import annotations

from typing import Any

from coordinator.domain import MetaState
from coordinator.domain.records import to_record


def topology(state: MetaState) -> dict[str, Any]:
    return {
        "tables": {n: {"kind": t.kind, "writer": t.writer, "generation": t.generation} for n, t in sorted(state.tables.items())},
        "jobs": {
            j: {"sink": s.sink, "sources": list(s.sources), "external_topics": list(s.external_topics), "status": s.status}
            for j, s in sorted(state.jobs.items())
        },
        "edges": [list(e) for e in state.edges()],
    }


def table(state: MetaState, name: str) -> dict[str, Any] | None:
    t = state.tables.get(name)
    if t is None:
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


def delays(state: MetaState) -> dict[str, Any]:
    """Per table: latest exact barrier, lag in barriers, last E2E delay (committed_at - ts(b))."""
    last = state.last_barrier()
    out: dict[str, Any] = {}
    for name in sorted(state.tables):
        latest = state.latest_exact(name)
        delay = None
        if latest is not None and latest in state.barriers:
            delay = state.completions[name][latest].committed_at_ms - state.barriers[latest].ts_ms
        out[name] = {"latest_exact_barrier": latest, "lag_barriers": last - (latest or 0), "e2e_delay_ms": delay}
    return out


def metrics(state: MetaState, counters: dict[str, int]) -> str:
    """Prometheus text exposition."""
    lines = [
        "# HELP lockstep_last_barrier Newest announced barrier id.",
        "# TYPE lockstep_last_barrier gauge",
        f"lockstep_last_barrier {state.last_barrier()}",
        "# HELP lockstep_barrier_lag Announced barriers not yet an exact point of the table.",
        "# TYPE lockstep_barrier_lag gauge",
    ]
    d = delays(state)
    lines += [f'lockstep_barrier_lag{{table="{t}"}} {v["lag_barriers"]}' for t, v in d.items()]
    lines += ["# HELP lockstep_e2e_delay_ms Commit time minus barrier time at the latest exact point.",
              "# TYPE lockstep_e2e_delay_ms gauge"]
    lines += [f'lockstep_e2e_delay_ms{{table="{t}"}} {v["e2e_delay_ms"]}' for t, v in d.items() if v["e2e_delay_ms"] is not None]
    for name, value in sorted(counters.items()):
        lines += [f"# TYPE lockstep_{name} counter", f"lockstep_{name}_total {value}"]
    return "\n".join(lines) + "\n"
