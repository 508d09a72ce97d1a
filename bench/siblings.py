"""A sibling aggregate's barrier, alone in a warm session: what a table costs per barrier.

``--tables`` aggregates (``GROUP BY k`` over ``--keys`` keys, as ``bench.freshness --siblings``
builds them) over one appended root, each barrier ``--changed`` new root rows, each table's
barrier processed by its ``TableMaintainer`` one after another in one SparkSession: no broker
load, no coordinator, no other job, so what is measured is the table's own fixed work. Barriers
alternate between Lockstep's way (a read of at most ``delta_log.ONE_TASK_BYTES`` in one
partition: one stage of one task) and the baseline (every read split as Spark splits it, the
shuffles planned as before), so both see the same warm-up and the same noise of the machine.
Per table per barrier it prints core-seconds (the driver JVM's and this process's CPU), wall
time, Spark jobs and stages, and where the wall time went (the maintainer's phases). Beside
them, measured in every round of the same session, Spark's own floor: an empty Spark job
(``count`` of ``--changed`` numbers) and a plain Delta append of ``--keys`` rows through
Spark's DataFrame writer (what one table's commit costs with nothing of Lockstep's in it).

Usage: python -m bench.siblings [--tables 3] [--rounds 40] [--changed 1000] [--keys 1000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from bench.results import Figures, add_json_flag
from bench.stack import local_stack

WARM_UP = 4  # barriers before the measured ones (the JIT compiles the hot code in these)


@dataclass(frozen=True)
class Measured:
    """One barrier of every table, per table: core-seconds, wall seconds, Spark jobs and stages,
    and the first table's phases (ms)."""

    one_task: bool
    core_s: float
    wall_s: float
    jobs: float
    stages: float
    phases: dict[str, float]


FLOORS = ("an empty Spark job", "a plain Delta append")


def cpu_seconds(processes: list[psutil.Process]) -> float:
    return sum(t.user + t.system for t in (p.cpu_times() for p in processes))


def timed(processes: list[psutil.Process], work: Callable[[], object]) -> tuple[float, float]:
    """(core-seconds, wall seconds) of ``work``."""
    cpu, began = cpu_seconds(processes), time.perf_counter()
    work()
    return cpu_seconds(processes) - cpu, time.perf_counter() - began


def run(tables: int, rounds: int, changed: int, keys: int, figures: Figures) -> None:
    from pyspark.sql import functions as F

    from coordinator.domain.work import BarrierWork
    from spark_jobs.planning.pipeline import DerivedTable
    from spark_jobs.planning.plan import TableShape
    from spark_jobs.planning.plans import plan_query
    from spark_jobs.runtime import delta_log
    from spark_jobs.runtime.commits import CompletionPublisher, DeltaSink
    from spark_jobs.runtime.ivm import TableMaintainer
    from spark_jobs.runtime.session import build_session

    one_task_bytes = delta_log.ONE_TASK_BYTES
    with local_stack() as settings:
        spark = build_session("bench-siblings", settings=settings)
        me = psutil.Process()
        processes = [me, *[c for c in me.children(recursive=True) if "java" in c.name()]]
        tracker = spark.sparkContext.statusTracker()
        root = DeltaSink(spark, settings.table_location("events"), "ingest_events", "k BIGINT, v BIGINT, ts BIGINT")

        def rows(b: int):  # noqa: ANN202 - a DataFrame
            return spark.range(changed).select(((F.col("id") * 7 + b) % keys).alias("k")).select(
                "k", (F.col("k") % 13 + b).alias("v"), F.lit(b * 1000).cast("bigint").alias("ts"))

        versions = {"events": root.commit(1, 0, lambda: root.append(rows(1)))}
        publisher = CompletionPublisher(settings)
        jobs = []
        for i in range(tables):
            query = f"SELECT k, COUNT(*) AS n, SUM(v * {i + 2}) AS total, MAX(ts) AS newest_ts FROM events GROUP BY k"
            plan = plan_query(query, {"events": TableShape(None, True)})
            jobs.append(TableMaintainer(spark, DerivedTable(f"agg_{i}", query, plan.sources), plan, f"maintain_agg_{i}",
                                        settings.table_location, publisher))
        print(f"{tables} tables, each: {jobs[0].plan.explain()}")
        measured: list[Measured] = []
        floors: dict[str, list[tuple[float, float]]] = {name: [] for name in FLOORS}
        plain = settings.table_location("plain_append")

        def empty_job() -> None:
            spark.range(changed).count()

        def plain_append(b: int) -> None:
            (spark.range(keys).select(F.col("id").alias("k"), F.lit(b).cast("bigint").alias("n")).coalesce(1)
             .write.format("delta").mode("append").save(plain))

        for b in range(1, rounds + WARM_UP + 2):
            if b > 1:
                versions["events"] = root.commit(b, 0, lambda b=b: root.append(rows(b)))
            one_task = b % 2 == 1
            delta_log.ONE_TASK_BYTES = one_task_bytes if one_task else -1
            last_job = max(tracker.getJobIdsForGroup(None) or [-1])
            cpu, began = cpu_seconds(processes), time.perf_counter()
            for job in jobs:
                job.process(BarrierWork(b, 0, 0, source_versions=dict(versions)))
            wall, used = time.perf_counter() - began, cpu_seconds(processes) - cpu
            new_jobs = [j for j in tracker.getJobIdsForGroup(None) if j > last_job]
            stages = sum(len(info.stageIds) for info in map(tracker.getJobInfo, new_jobs) if info is not None)
            floor = {FLOORS[0]: timed(processes, empty_job), FLOORS[1]: timed(processes, lambda b=b: plain_append(b))}
            if b > WARM_UP + 1:
                for name, figure in floor.items():
                    floors[name].append(figure)
                measured.append(Measured(one_task, used / tables, wall / tables, len(new_jobs) / tables,
                                         stages / tables, {p.name: p.ms for p in jobs[0].watch.phases()}))
        delta_log.ONE_TASK_BYTES = one_task_bytes
        for job in jobs:
            job.close()
        publisher.close()
        spark.stop()
    report(measured, floors, figures, tables=tables, changed=changed, keys=keys)


def report(measured: list[Measured], floors: dict[str, list[tuple[float, float]]], figures: Figures,
           **context: object) -> None:
    ways = {"one task (Lockstep)": [m for m in measured if m.one_task],
            "Spark's split (baseline)": [m for m in measured if not m.one_task]}
    median = {way: statistics.median(m.core_s for m in ms) for way, ms in ways.items()}
    baseline = median["Spark's split (baseline)"]
    print(f"{'per table per barrier':<26} {'core-s':>7} {'spread':>13} {'wall s':>7} {'jobs':>5} {'stages':>6}  "
          "phases (ms, median)")
    for way, ms in ways.items():
        cores = [m.core_s for m in ms]
        phases = {name: statistics.median(m.phases.get(name, 0.0) for m in ms) for name in ms[0].phases}
        print(f"{way:<26} {median[way]:>7.3f} {min(cores):>6.3f}-{max(cores):<6.3f} "
              f"{statistics.median(m.wall_s for m in ms):>7.3f} {statistics.median(m.jobs for m in ms):>5.1f} "
              f"{statistics.median(m.stages for m in ms):>6.1f}  " + " ".join(f"{k} {v:.0f}" for k, v in phases.items()))
        figures.add_median(f"core-s per table per barrier, {way}", cores, "core-s", baseline=baseline, **context)
    for name, figure in floors.items():
        cores = [c for c, _ in figure]
        print(f"{name:<26} {statistics.median(cores):>7.3f} {min(cores):>6.3f}-{max(cores):<6.3f} "
              f"{statistics.median(w for _, w in figure):>7.3f}   (Spark's floor, every barrier, same session)")
        figures.add_median(f"core-s, {name}", cores, "core-s", baseline=baseline, **context)
    print(f"ratio baseline / one task: {baseline / median['one task (Lockstep)']:.2f}x "
          f"({len(measured)} barriers, alternating); one task / a plain Delta append: "
          f"{median['one task (Lockstep)'] / statistics.median(c for c, _ in floors[FLOORS[1]]):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=3, help="sibling aggregates over the root (default 3)")
    parser.add_argument("--rounds", type=int, default=40, help="barriers measured, half each way (default 40)")
    parser.add_argument("--changed", type=int, default=1000, help="root rows appended per barrier (default 1,000)")
    parser.add_argument("--keys", type=int, default=1000, help="distinct keys, the rows of each aggregate (default 1,000)")
    add_json_flag(parser)
    args = parser.parse_args()
    for name in ("tables", "rounds", "changed", "keys"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    figures = Figures("siblings", args)
    run(args.tables, args.rounds, args.changed, args.keys, figures)
    figures.write()


if __name__ == "__main__":
    main()
