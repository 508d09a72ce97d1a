"""How coordination costs grow: with the state over simulated time, pruned (``retention``), and
with the topology's size (``topology``: 3 tables against 100). Pure folds and plans in this
process: no broker, no worker.

Run as ``python -m bench.coordinator retention|topology``, which dispatches here.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

from coordinator.domain import BarrierAnnounced, BarrierCompleted, JobState, TableState, fold_all

if TYPE_CHECKING:
    from bench.results import Figures


def bench_retention(barriers: int, tables: int, retain: int, figures: Figures) -> None:
    """Fold a simulated run (a barrier a second, a completion per table per barrier, the leader
    pruning every 5 s) and measure, after one simulated hour and at the end: state records, the
    replay (fold of every record), a barrier tick (plan_barrier) and a read-committed /snapshot
    resolution. The hour is the baseline the end is compared with; without pruning, the hour's
    figures are printed too."""
    from coordinator.domain import MetaState, fold
    from coordinator.domain.barriers import BarrierConfig, plan_barrier
    from coordinator.domain.events import CutEntry
    from coordinator.domain.pruning import prunable
    from coordinator.domain.snapshot import resolve_snapshot

    names = [f"t{i}" for i in range(tables)]
    config = BarrierConfig(interval_ms=1000, max_inflight=10**9)

    def measure(state: MetaState) -> dict[str, float]:
        records = [*state.tables.values(), *state.jobs.values(), *state.barriers.values(),
                   *(c for by_b in state.completions.values() for c in by_b.values())]
        replay = []
        for _ in range(3):
            t0 = time.perf_counter()
            fold_all(records)
            replay.append(time.perf_counter() - t0)
        now = state.last_barrier() * 1000 + 1000
        cut = [CutEntry("src", 0, state.last_barrier())]
        tick, snap = [], []
        for _ in range(200):
            t0 = time.perf_counter()
            plan_barrier(state, now, cut, config)
            t1 = time.perf_counter()
            resolve_snapshot(state, names)
            t2 = time.perf_counter()
            tick.append(t1 - t0)
            snap.append(t2 - t1)
        return {"records": state.records(), "replay_ms": statistics.median(replay) * 1000,
                "tick_ms": statistics.median(tick) * 1000, "snapshot_ms": statistics.median(snap) * 1000}

    def simulate(until: int, prune: bool, marks: set[int]) -> dict[int, dict[str, float]]:
        state = fold_all([TableState(t, "root") for t in names] +
                         [JobState(f"j_{t}", t, external_topics=("src",)) for t in names])
        out: dict[int, dict[str, float]] = {}
        started = time.perf_counter()
        for b in range(1, until + 1):
            state = fold(state, BarrierAnnounced(b, b * 1000, (CutEntry("src", 0, b),)))
            for t in names:
                state = fold(state, BarrierCompleted(f"j_{t}", t, b, 0, b, committed_at_ms=b * 1000 + 300))
            if prune and b % 5 == 0:
                for tombstone in prunable(state, retain):
                    state = fold(state, tombstone)
            if b in marks:
                out[b] = measure(state)
                print(f"  {'pruned' if prune else 'unpruned'} barrier {b:>9,}: {out[b]['records']:>9,.0f} records, "
                      f"simulated in {time.perf_counter() - started:6.1f} s", flush=True)
        return out

    hour = min(3600, barriers)
    print(f"simulating {barriers:,} barriers x {tables} tables, retention {retain} barriers")
    unpruned = simulate(hour, prune=False, marks={hour})[hour]
    pruned = simulate(barriers, prune=True, marks={hour, barriers})
    base, end = pruned[hour], pruned[barriers]
    print(f"{'':24}{'1 h, unpruned':>16}{'1 h, pruned':>14}{'end, pruned':>14}{'end / 1 h':>11}")
    context: dict[str, Any] = {"subcommand": "retention", "barriers": barriers, "tables": tables, "retain": retain}
    for key, label in (("records", "state records"), ("replay_ms", "replay (ms)"), ("tick_ms", "barrier tick (ms)"),
                       ("snapshot_ms", "/snapshot resolve (ms)")):
        print(f"{label:24}{unpruned[key]:16,.3f}{base[key]:14,.3f}{end[key]:14,.3f}{end[key] / base[key]:11.2f}")
        unit = "ms" if label.endswith("(ms)") else "records"
        figures.add(label, end[key], unit, baseline=base[key], ratio=end[key] / base[key], at="end, pruned",
                    baseline_at="1 h, pruned", **context)
        figures.add(label, unpruned[key], unit, at="1 h, unpruned", **context)


def bench_topology(barriers: int, retain: int, figures: Figures) -> None:
    """Coordination cost against topology size: the shopping shape (1 root, 2 aggregates: the
    baseline) and 100 tables with 100 jobs (10 roots, each feeding 9 derived tables), folded
    through ``barriers`` barriers with every table committing each one (source versions on the
    derived ones) and pruning every 5 barriers. Then 30 more barriers as the leader lives them:
    each barrier announced, every job's completion folded, and the leader's tick every 50 ms
    replanning whenever facts arrived since the last tick, as the worker does: with the
    ``Pacer`` the leader keeps (what changed replanned), and from scratch (``next_due``, the
    baseline in the same run); plus the announcement (``plan_barrier``) and a read-committed
    ``/snapshot`` of two tables (the same query in both) and of every table, medians of 300, and
    the live page's ``/overview`` (median of 20)."""
    from coordinator.domain import MetaState, fold
    from coordinator.domain.barriers import BarrierConfig, next_due, plan_barrier
    from coordinator.domain.events import CutEntry, SourceVersion
    from coordinator.domain.pacer import Pacer
    from coordinator.domain.pruning import prunable
    from coordinator.domain.snapshot import resolve_snapshot
    from coordinator.stream import views

    config = BarrierConfig(interval_ms=1000, max_inflight=10**9)
    ticks_per_barrier = 20  # a 50 ms tick, 1 s barriers

    def shape(roots: int, per_root: int) -> dict[str, str | None]:
        """table -> its source (None for a root), every source before its readers."""
        out: dict[str, str | None] = {}
        for r in range(roots):
            out[f"root{r}"] = None
            out |= {f"root{r}_d{d}": f"root{r}" for d in range(per_root)}
        return out

    def barrier_facts(tables: dict[str, str | None], topics: list[str], b: int) -> list[object]:
        """Barrier ``b``'s announcement and every table's completion (roots committed 300 ms after
        it, derived tables 300 ms after their root), in the order they happen."""
        facts: list[object] = [BarrierAnnounced(b, b * 1000, tuple(CutEntry(topic, 0, b) for topic in topics))]
        for t, src in tables.items():
            start = b * 1000 + (50 if src is None else 350)
            facts.append(BarrierCompleted(f"j_{t}", t, b, 0, b, started_at_ms=start, committed_at_ms=start + 250,
                                          source_versions=(SourceVersion(src, b),) if src is not None else ()))
        return facts

    def measure(tables: dict[str, str | None], pacer: Pacer | None, profile: cProfile.Profile | None = None) -> dict[str, float]:
        names = list(tables)
        topics = sorted({f"src{t}" for t, source in tables.items() if source is None})
        state: MetaState = fold_all(
            [TableState(t, "root" if src is None else "intermediate") for t, src in tables.items()] +
            [JobState(f"j_{t}", t, external_topics=(f"src{t}",)) if src is None else
             JobState(f"j_{t}", t, sources=(src,)) for t, src in tables.items()])
        for b in range(1, barriers + 1):
            state = fold_all(barrier_facts(tables, topics, b), state)  # type: ignore[arg-type]
            if b % 5 == 0:
                for tombstone in prunable(state, retain):
                    state = fold(state, tombstone)
        replans: list[float] = []
        folded = 0  # facts that arrived before a replan
        announces: list[float] = []
        per_barrier: list[float] = []
        for b in range(barriers + 1, barriers + 31):
            facts = barrier_facts(tables, topics, b)
            spent = 0.0
            for tick in range(ticks_per_barrier):
                arrived = facts[len(facts) * tick // ticks_per_barrier:len(facts) * (tick + 1) // ticks_per_barrier]
                if not arrived:
                    continue  # nothing new: the worker does not replan
                state = fold_all(arrived, state)  # type: ignore[arg-type]
                folded += len(arrived)
                t0 = time.perf_counter()
                if pacer is None:
                    next_due(state, b * 1000 + tick * 50, config)
                elif profile is None:
                    pacer.next_due(state, b * 1000 + tick * 50)
                else:  # a run to see where the time goes (its timings are not reported)
                    profile.runcall(pacer.next_due, state, b * 1000 + tick * 50)
                replans.append(time.perf_counter() - t0)
                spent += replans[-1]
            t0 = time.perf_counter()
            cut = [CutEntry(topic, 0, b + 1) for topic in topics]
            if pacer is None:
                plan_barrier(state, b * 1000 + 1000, cut, config)
            else:
                pacer.plan_barrier(state, b * 1000 + 1000, cut)
            announces.append(time.perf_counter() - t0)
            per_barrier.append(spent + announces[-1])
        pair = [names[0], names[1]]
        timings: dict[str, list[float]] = {"pair": [], "all": []}
        for _ in range(300):
            t0 = time.perf_counter()
            resolve_snapshot(state, pair)
            t1 = time.perf_counter()
            resolve_snapshot(state, names)
            timings["pair"].append(t1 - t0)
            timings["all"].append(time.perf_counter() - t1)
        timings["overview"] = []
        for _ in range(20):  # what the live page asks once a second (the worker holds the state's lock meanwhile)
            t0 = time.perf_counter()
            views.overview(state, (barriers + 31) * 1000, config.liveness_ms, [])
            timings["overview"].append(time.perf_counter() - t0)
        return {"records": state.records(), "replans": len(replans) / 30, "tick": statistics.median(replans) * 1000,
                "facts": folded / len(replans), "per_fact": sum(replans) / folded * 1000,
                "announce": statistics.median(announces) * 1000, "barrier": statistics.median(per_barrier) * 1000,
                **{k: statistics.median(v) * 1000 for k, v in timings.items()}}

    print(f"{barriers:,} barriers, every table committing each, retention {retain}; then 30 barriers ticked live "
          "(medians); /snapshot medians of 300")
    rows = (("records", "state records"), ("replans", "replans per barrier"), ("facts", "facts arrived per replan"),
            ("tick", "replan (tick) (ms)"), ("per_fact", "replan time per fact arrived (ms)"),
            ("announce", "announce (ms)"), ("barrier", "leader CPU per barrier (ms)"),
            ("pair", "/snapshot of 2 tables (ms)"), ("all", "/snapshot of every table (ms)"),
            ("overview", "/overview, the page's poll (ms)"))
    for label, pacer_of in (("from scratch (baseline)", lambda: None), ("with the leader's Pacer", lambda: Pacer(config))):
        small, large = measure(shape(1, 2), pacer_of()), measure(shape(10, 9), pacer_of())
        print(f"\n{label:34}{'3 tables, 3 jobs':>18}{'100 tables, 100 jobs':>22}{'ratio':>8}")
        for key, text in rows:
            print(f"{text:34}{small[key]:18,.3f}{large[key]:22,.3f}{large[key] / small[key]:8.2f}")
            figures.add(text, large[key], "ms" if text.endswith("(ms)") else key, baseline=small[key],
                        ratio=large[key] / small[key], subcommand="topology", planner=label, barriers=barriers,
                        retain=retain, tables="100 tables, 100 jobs", baseline_tables="3 tables, 3 jobs")
    profile = cProfile.Profile()
    measure(shape(10, 9), Pacer(config), profile)
    print("\nwhere the Pacer's replans go at 100 tables (cProfile, own time, top 8):")
    pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(8)
