"""What ``bench.freshness`` prints and records once a topology has run: staleness percentiles
and their trend per system, the ratio Lockstep / plain, CPU per process, and Lockstep's
per-barrier cost of every job (read from the coordinator's state).

Kept apart from the runner, which starts the stack and the child processes: this only turns
their output into figures.
"""

from __future__ import annotations

import argparse
import statistics
from typing import TYPE_CHECKING, Any

from coordinator.domain.delays import percentile
from coordinator.domain.pacing import ready_at

if TYPE_CHECKING:
    from bench.results import Figures
    from bench.topologies import Topology

SLICE_S = 30  # the timeline's step


def job_costs(settings: Any, topology: Topology, start: float, end: float, load_start: float) -> dict[str, Any]:
    """Per job, over the barriers announced in the measured window: how long each one waited
    for its inputs, took, and (where the job reports it) where that time went; and its E2E p50
    in each ``SLICE_S`` since the load began (the warm-up too), to see how long a start lasts."""
    from coordinator.client.state import read_state

    state = read_state(settings)
    window = {b: a for b, a in state.barriers.items() if start * 1000 <= a.ts_ms <= end * 1000}
    out: dict[str, Any] = {"barriers": len(window)}
    if len(window) > 1:
        ts = sorted(a.ts_ms for a in window.values())
        out["interval_ms"] = statistics.median(b - a for a, b in zip(ts, ts[1:], strict=False))
    for job in sorted(state.jobs.values(), key=lambda j: (bool(j.sources), j.job_id)):
        done = state.completions.get(job.sink, {})
        rows: dict[str, list[float]] = {}
        for b in sorted(window):
            c = done.get(b)
            if c is None or not c.started_at_ms:
                continue
            ready = ready_at(state, job, b)
            if ready is None:
                continue
            rows.setdefault("wait", []).append(c.started_at_ms - ready)
            rows.setdefault("process", []).append(c.committed_at_ms - c.started_at_ms)
            rows.setdefault("e2e", []).append(c.committed_at_ms - window[b].ts_ms)
            rows.setdefault("rows_in", []).append(c.rows_in)
            for phase in getattr(c, "phases", ()):
                rows.setdefault(phase.name, []).append(phase.ms)
        out[job.job_id] = {k: (statistics.median(v), percentile(v, 0.9)) for k, v in rows.items()}
        out[job.job_id]["committed"] = len(rows.get("process", []))
        slices: list[list[float]] = [[] for _ in range(int((end - load_start) // SLICE_S) + 1)]
        for b, announced in state.barriers.items():
            if (c := done.get(b)) is not None and load_start * 1000 <= announced.ts_ms <= end * 1000:
                slices[int((announced.ts_ms / 1000 - load_start) // SLICE_S)].append(c.committed_at_ms - announced.ts_ms)
        out[job.job_id]["timeline"] = [statistics.median(s) / 1000 if s else None for s in slices]
    return out


def _quarters(reads: list[dict[str, Any]]) -> list[list[float]]:
    """Staleness (s) of the reads in each quarter of the window: a growing p50 means falling behind."""
    if not reads:
        return []
    start, span = reads[0]["t"], max(1e-9, reads[-1]["t"] - reads[0]["t"])
    out: list[list[float]] = [[], [], [], []]
    for r in reads:
        if r["staleness_ms"] is not None:
            out[min(3, int(4 * (r["t"] - start) / span))].append(r["staleness_ms"] / 1000)
    return out


def report(topology: Topology, results: dict[str, dict[str, Any]], args: argparse.Namespace,
           figures: Figures) -> dict[str, Any]:
    """Print and record one topology's run; returns Lockstep's summary for ``compare_siblings``."""
    reader = "reader caches by versions" if args.reader_cache else "every read runs the query"
    reader += f", {args.reads_per_s:g} read(s)/s at most" if args.reads_per_s else ", back to back"
    if args.siblings:
        reader += f"; {len(topology.aggregates)} aggregate(s) over the root"
    print(f"\n== {topology.name}: {args.rate:,} records/s, {args.seconds:.0f} s measured after {args.warmup:.0f} s warm-up; "
          f"{reader}")
    rows = []
    summary: dict[str, dict[str, float | None]] = {}
    for system, res in results.items():
        reads = res["reads"]
        stale = [r["staleness_ms"] / 1000 for r in reads if r["staleness_ms"] is not None]
        summary[system] = {"p50": percentile(stale, 0.5), "p90": percentile(stale, 0.9), "p99": percentile(stale, 0.99),
                           "max": max(stale, default=None)}
        quarters = _quarters(reads)
        bad = [r for r in reads if r["anomalies"]]
        rows.append((system, len(reads), len(reads) / args.seconds, summary[system], len(bad), sum(r["anomalies"] for r in bad),
                     [percentile(q, 0.5) for q in quarters], statistics.median([r["read_ms"] for r in reads]) if reads else None))
    print(f"{'system':10s} {'reads':>6s} {'reads/s':>7s} {'stale p50':>9s} {'p90':>6s} {'p99':>6s} {'max':>6s} "
          f"{'anomalous reads (rows)':>23s}  {'p50 per quarter':24s} {'read p50':>8s}")
    for system, n, rate, s, bad, bad_rows, quarters, read_ms in rows:
        fmt = lambda v: "-" if v is None else f"{v:6.2f}"  # noqa: E731
        print(f"{system:10s} {n:6d} {rate:7.2f} {fmt(s['p50']):>9s} {fmt(s['p90'])} {fmt(s['p99'])} {fmt(s['max'])} "
              f"{f'{bad} ({bad_rows})':>23s}  {' '.join(fmt(q) for q in quarters):24s} {read_ms or 0:6.0f}ms")
        at = {"topology": topology.name, "system": system, "rate": args.rate}
        plain = summary["plain"] if system == "lockstep" and summary.get("plain", {}).get("p50") else {}
        for k, v in s.items():
            if v is not None:
                base = plain.get(k) if k != "max" else None
                figures.add(f"staleness {k}", v, "s", baseline=base or None, ratio=v / base if base else None, **at)
        quarterly = [(f"staleness p50, quarter {i + 1}", q, "s") for i, q in enumerate(quarters) if q is not None]
        for name, value, unit in (("reads", n, "reads"), ("reads/s", rate, "reads/s"), ("anomalous reads", bad, "reads"),
                                  ("anomalous rows", bad_rows, "rows"), ("read p50", read_ms or 0, "ms"), *quarterly):
            figures.add(name, value, unit, **at)
    if "lockstep" in summary and "plain" in summary and summary["plain"]["p50"]:
        ls, pl = summary["lockstep"], summary["plain"]
        print("ratio lockstep / plain staleness: " + ", ".join(
            f"{k} {ls[k] / pl[k]:.2f}" for k in ("p50", "p90", "p99") if ls[k] is not None and pl[k]))
    for system, res in results.items():
        print(f"{system} CPU (cores busy): " + ", ".join(f"{r} {c:.2f}" for r, c in sorted(res["cpu"].items())) +
              f"; total {sum(res['cpu'].values()):.2f}; generator: {' '.join(res['generated'])}")
        for role, cores in {**res["cpu"], "total": sum(res["cpu"].values())}.items():
            figures.add("CPU", cores, "cores busy", role=role, topology=topology.name, system=system, rate=args.rate)
    jobs = results.get("lockstep", {}).get("jobs")
    out: dict[str, Any] = {"aggregates": len(topology.aggregates),
                           **{f"stale {k}": v for k, v in summary.get("lockstep", {}).items()}}
    if jobs:
        commits = sum(c["committed"] for c in jobs.values() if isinstance(c, dict))
        busy = results["lockstep"]["cpu"].get("jobs", 0.0)
        if commits:
            # the jobs' process's CPU over the window, per table commit (a table's barrier)
            out["core_s_per_table_barrier"] = busy * args.seconds / commits
            print(f"lockstep jobs: {busy:.2f} cores busy for {commits} table commits in {args.seconds:.0f} s: "
                  f"{out['core_s_per_table_barrier']:.3f} core-s per table per barrier")
            figures.add("core-s per table per barrier", out["core_s_per_table_barrier"], "core-s",
                        aggregates=len(topology.aggregates), topology=topology.name, system="lockstep", rate=args.rate)
        out["interval_ms"] = jobs.get("interval_ms")
        print(f"lockstep barriers in the window: {jobs['barriers']}, interval p50 {jobs.get('interval_ms', 0):.0f} ms")
        at = {"topology": topology.name, "system": "lockstep", "rate": args.rate}
        figures.add("barriers in the window", jobs["barriers"], "barriers", **at)
        figures.add("barrier interval p50", jobs.get("interval_ms", 0), "ms", **at)
        print("per barrier, p50 / p90 in ms (wait: inputs ready -> job starts; process: start -> committed; "
              "e2e: announced -> committed):")
        for job, costs in jobs.items():
            if not isinstance(costs, dict):
                continue
            parts = ", ".join(f"{k} {v[0]:.0f}/{v[1]:.0f}" for k, v in costs.items() if k not in ("committed", "timeline"))
            print(f"  {job:24s} {costs['committed']:4d} barriers: {parts}")
            for k, v in costs.items():
                if k not in ("committed", "timeline"):
                    for q, x in zip(("p50", "p90"), v, strict=True):
                        figures.add(f"{k} {q}", x, "rows" if k == "rows_in" else "ms", job=job, barriers=costs["committed"], **at)
        print(f"e2e p50 in s per {SLICE_S} s since the load began (the warm-up first):")
        for job, costs in jobs.items():
            if isinstance(costs, dict):
                print(f"  {job:24s} " + " ".join("-" if v is None else f"{v:.1f}" for v in costs["timeline"]))
                for i, v in enumerate(costs["timeline"]):
                    if v is not None:
                        figures.add(f"e2e p50 per {SLICE_S} s", v, "s", job=job, since_load_s=i * SLICE_S, **at)
    return out


def compare_siblings(runs: list[dict[str, Any]], figures: Figures) -> None:
    """Lockstep's staleness and cost per table as the aggregates over one root grow, each next to
    the run with the fewest (measured in the same invocation) as a ratio."""
    if len(runs) < 2:
        return
    base = runs[0]
    print(f"\n== as the pipeline grows (ratios to {base['aggregates']} aggregate(s), measured in this run)")
    print(f"{'aggregates':>10s} {'stale p50':>9s} {'ratio':>6s} {'p90':>6s} {'barrier interval':>16s} "
          f"{'core-s per table per barrier':>28s} {'ratio':>6s}")
    for run in runs:
        p50, b50 = run.get("stale p50"), base.get("stale p50")
        cost, b_cost = run.get("core_s_per_table_barrier"), base.get("core_s_per_table_barrier")
        ratio = p50 / b50 if p50 and b50 else None
        cost_ratio = cost / b_cost if cost and b_cost else None
        fmt = lambda v, f="{:.2f}": "-" if v is None else f.format(v)  # noqa: E731
        print(f"{run['aggregates']:>10d} {fmt(p50):>9s} {fmt(ratio):>6s} {fmt(run.get('stale p90')):>6s} "
              f"{fmt(run.get('interval_ms'), '{:.0f} ms'):>16s} {fmt(cost, '{:.3f}'):>28s} {fmt(cost_ratio):>6s}")
        if p50 is not None:
            figures.add("staleness p50 as aggregates grow", p50, "s", baseline=b50, ratio=ratio,
                        aggregates=run["aggregates"], system="lockstep")


def compare_strides(runs: list[tuple[int, dict[str, Any]]], figures: Figures) -> None:
    """The reads' staleness per ``LOCKSTEP_BARRIER_STRIDE_AFTER`` value, each next to the last
    run's (strides off, measured in the same invocation) as a ratio."""
    if len(runs) < 2:
        return
    base_value, base = runs[-1]
    print(f"\n== a slow table beside the read (ratios to LOCKSTEP_BARRIER_STRIDE_AFTER={base_value}, measured in this run)")
    print(f"{'stride after':>12s} {'stale p50':>9s} {'ratio':>6s} {'p90':>6s} {'barrier interval':>16s}")
    fmt = lambda v, f="{:.2f}": "-" if v is None else f.format(v)  # noqa: E731
    for value, run in runs:
        p50, b50 = run.get("stale p50"), base.get("stale p50")
        ratio = p50 / b50 if p50 and b50 else None
        print(f"{value:>12d} {fmt(p50):>9s} {fmt(ratio):>6s} {fmt(run.get('stale p90')):>6s} "
              f"{fmt(run.get('interval_ms'), '{:.0f} ms'):>16s}")
        if p50 is not None:
            figures.add("staleness p50 beside a slow table", p50, "s", baseline=b50, ratio=ratio, stride_after=value,
                        system="lockstep")
