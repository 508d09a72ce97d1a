"""What one consistent read costs, by path, while the pipeline it reads runs: the light path
(``lockstep_reads``: delta-rs and DataFusion in the reader's process), ``lockstep serve``
through psycopg, and Spark's ``open_snapshot`` (the baseline), all reading FLIP-276's join of
``user_item_amount`` and ``user_item_price`` at read-committed, in the same run.

A fresh broker, a coordinator and ``lockstep run pipelines/shopping.sql`` with a generator at
``--rate`` purchases/s; once the tables exist and ``--warmup`` has passed, rounds of reads
alternate the paths (``--reads`` each per round), so all see the same load. Every read is a new
snapshot (no memo), as a client asking again and again would make it.

Printed per path: wall time per read p50 / p90 / max (the median of the rounds' medians, and
their spread), the ratio to Spark's p50, CPU per read (the reader's process, plus the server's
for ``serve`` and the JVM's for Spark), and for the light path where a read's time goes (the
coordinator's pin, opening the versions, the query).

Usage::

    python -m bench.reads                       # 1,000 purchases/s, 3 rounds of 50 reads per path
    python -m bench.reads --rounds 5 --reads 100 --rate 0   # an idle pipeline
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil

from bench.results import Figures, add_json_flag
from bench.stack import ROOT, Processes, stack, wait_created
from coordinator.domain.delays import percentile
from spark_jobs.demo.probes import FLIP_JOIN, TABLES, wrong_prices

PATHS = ("light", "serve", "spark")


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its children."""
    try:
        proc = psutil.Process(pid)
        return sum(sum(p.cpu_times()[:2]) for p in [proc, *proc.children(recursive=True)])
    except psutil.Error:
        return 0.0


class Readers:
    """One reader per path, each timing one read of FLIP_JOIN at read-committed."""

    def __init__(self, env: dict[str, str], tmp: Path, procs: Processes) -> None:
        import psycopg

        from coordinator.settings import Settings
        from lockstep.dev.broker import free_port
        from spark_jobs.runtime.session import build_session

        self.settings = Settings.from_env(env)
        port = free_port()
        self.server = procs.start("serve", [sys.executable, "-m", "lockstep", "serve", "--port", str(port)], env,
                                  tmp / "serve.log")
        deadline = time.monotonic() + 60
        while "serving Lockstep's tables" not in (tmp / "serve.log").read_text():
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"lockstep serve did not start:\n{(tmp / 'serve.log').read_text()[-2000:]}")
            time.sleep(0.2)
        self.conn = psycopg.connect(f"host=127.0.0.1 port={port} user=lockstep dbname=lockstep", autocommit=True)
        self.spark = build_session("bench-reads", settings=self.settings)
        # this process's own Spark JVM: its direct child (the jobs' JVM is the jobs' process's child)
        self.jvm = next(p.pid for p in psutil.Process().children() if p.name().startswith("java"))
        self.phases: dict[str, list[float]] = {"pin": [], "open": [], "query": []}
        self.anomalies = 0

    def read(self, path: str) -> tuple[float, float]:
        """One read on ``path``: (wall seconds, CPU seconds of the processes doing it)."""
        cpu0 = time.process_time() + (tree_cpu(self.server.pid) if path == "serve" else 0.0) \
            + (tree_cpu(self.jvm) if path == "spark" else 0.0)
        start = time.perf_counter()
        rows = getattr(self, f"_read_{path}")()
        wall = time.perf_counter() - start
        cpu1 = time.process_time() + (tree_cpu(self.server.pid) if path == "serve" else 0.0) \
            + (tree_cpu(self.jvm) if path == "spark" else 0.0)
        self.anomalies += wrong_prices(rows) > 0
        return wall, cpu1 - cpu0

    def _read_light(self) -> list[Any]:
        from coordinator.client.snapshots import pin
        from lockstep_reads.engine import run_query
        from lockstep_reads.snapshot import versions_for

        t0 = time.perf_counter()
        pinned = pin(self.settings, list(TABLES))
        t1 = time.perf_counter()
        tables = {t: versions_for(self.settings).open(self.settings.table_location(t), pinned.versions[t], t)
                  for t in TABLES}
        t2 = time.perf_counter()
        rows = run_query(FLIP_JOIN, tables).to_pylist()
        t3 = time.perf_counter()
        for phase, seconds in zip(self.phases, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            self.phases[phase].append(seconds)
        return rows

    def _read_serve(self) -> list[Any]:
        cursor = self.conn.execute(FLIP_JOIN)
        names = [c.name for c in cursor.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def _read_spark(self) -> list[Any]:
        from lockstep_reads import open_snapshot

        with open_snapshot(list(TABLES), settings=self.settings, spark=self.spark) as snap:
            return [r.asDict() for r in snap.sql(FLIP_JOIN).collect()]

    def close(self) -> None:
        self.conn.close()
        self.spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=1000, help="purchases/s while reading (default 1,000; 0: idle)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of reads, the paths alternating (default 3)")
    parser.add_argument("--reads", type=int, default=50, help="reads per path per round (default 50)")
    parser.add_argument("--warmup", type=float, default=30, help="seconds of load before reading (default 30)")
    add_json_flag(parser)
    args = parser.parse_args()
    figures = Figures("reads", args)

    from bench.topologies import SHOPPING
    from coordinator.settings import Settings
    from spark_jobs.demo.datagen import ensure_topic

    with ExitStack() as cleanup:
        tmp = Path(tempfile.mkdtemp(prefix="bench-reads-"))
        cleanup.callback(shutil.rmtree, tmp, True)
        env, _ = cleanup.enter_context(stack(tmp, "lockstep", None))
        settings = Settings.from_env(env)
        ensure_topic(settings, "shopping_source", partitions=2)
        procs = Processes()
        cleanup.callback(procs.stop_all)
        procs.start("jobs", [sys.executable, "-m", "lockstep", "run", str(ROOT / "pipelines" / "shopping.sql")], env,
                    tmp / "jobs.log")
        wait_created(env, list(TABLES), procs, tmp / "jobs.log")
        if args.rate:
            procs.start("generator", [sys.executable, "-m", "bench.freshness", "child-generate", SHOPPING.name,
                                      "--rate", str(args.rate)], env, tmp / "gen.log")
        print(f"pipeline running, {args.rate:,} purchases/s; warming up {args.warmup:.0f} s", flush=True)
        time.sleep(args.warmup)
        readers = Readers(env, tmp, procs)
        cleanup.callback(readers.close)
        for path in PATHS:  # each path's first read pays its one-time set-up: not counted
            readers.read(path)
        walls: dict[str, list[list[float]]] = {p: [] for p in PATHS}
        cpus: dict[str, list[float]] = {p: [] for p in PATHS}
        for number in range(args.rounds):
            for path in PATHS:
                timed = [readers.read(path) for _ in range(args.reads)]
                walls[path].append([w for w, _ in timed])
                cpus[path] += [c for _, c in timed]
            print(f"round {number + 1}: " + ", ".join(f"{p} p50 {statistics.median(walls[p][-1]) * 1000:.1f} ms"
                                                      for p in PATHS), flush=True)
        report(walls, cpus, readers.phases, readers.anomalies, args, figures)
        figures.write()


def report(walls: dict[str, list[list[float]]], cpus: dict[str, list[float]], phases: dict[str, list[float]],
           anomalies: int, args: argparse.Namespace, figures: Figures) -> None:
    spark_p50 = statistics.median([statistics.median(r) for r in walls["spark"]])
    print(f"\nFLIP-276's join at read-committed, {args.rounds} rounds x {args.reads} reads per path, "
          f"{args.rate:,} purchases/s into the pipeline meanwhile:")
    print(f"{'path':<7} {'p50 ms':>8} {'spread':>15} {'p90 ms':>8} {'max ms':>8} {'vs spark':>9} {'CPU ms/read':>12}")
    for path in PATHS:
        medians = [statistics.median(r) * 1000 for r in walls[path]]
        every = [w * 1000 for r in walls[path] for w in r]
        p50 = statistics.median(medians)
        print(f"{path:<7} {p50:8.1f} {f'{min(medians):.1f}-{max(medians):.1f}':>15} {percentile(every, 0.9):8.1f} "
              f"{max(every):8.1f} {spark_p50 * 1000 / p50:8.1f}x {statistics.median(cpus[path]) * 1000:12.1f}")
        figures.add_median("read p50", medians, "ms", baseline=spark_p50 * 1000, path=path, rate=args.rate)
        figures.add("read p90", percentile(every, 0.9) or 0.0, "ms", path=path, rate=args.rate)
        figures.add("read max", max(every), "ms", path=path, rate=args.rate)
        figures.add_median("CPU per read", [c * 1000 for c in cpus[path]], "ms", path=path, rate=args.rate)
    print("light path, where a read's time goes (p50 ms): "
          + ", ".join(f"{phase} {statistics.median(s) * 1000:.1f}" for phase, s in phases.items()))
    for phase, s in phases.items():
        figures.add_median(f"light read {phase}", [t * 1000 for t in s], "ms", rate=args.rate)
    print(f"reads that saw an anomaly: {anomalies} (any is a bug)")
    figures.add("reads that saw an anomaly", anomalies, "reads", rate=args.rate)


if __name__ == "__main__":
    main()
