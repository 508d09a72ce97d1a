"""The Delta read and commit micro-benches of ``bench.spark_jobs``: ``changes`` (an appended
version read from its commit's files vs. the change data feed), ``reads`` (``read_version`` vs.
time travel) and ``commits`` (a barrier's commit in a non-UTC JVM), each one Delta operation
Lockstep does its own way against Delta's, on a scratch Spark session with no broker.

Kept apart from the benches of whole jobs (ingest, ivm, python); run as
``python -m bench.spark_jobs changes|reads|commits``, which dispatches here.
"""

from __future__ import annotations

import functools
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.stack import JARS
from coordinator.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from bench.results import Figures


@contextmanager
def scratch_spark(name: str) -> Iterator[tuple[SparkSession, str]]:
    """A session over a scratch folder, for the benches that only write and read tables (no
    broker); stopped at the end."""
    from spark_jobs.runtime.session import build_session

    with tempfile.TemporaryDirectory() as scratch:
        spark = build_session(name, settings=Settings(warehouse=f"{scratch}/wh", home=Path(scratch), jars=JARS))
        try:
            yield spark, scratch
        finally:
            spark.stop()


def print_medians(took: dict[str, list[float]], baseline: str, noun: str, versus: str, figures: Figures,
                  notes: dict[str, str] | None = None, **context: Any) -> None:
    """Each way's median time (ms) and spread, and the baseline's median over it."""
    base = statistics.median(took[baseline])
    width = max(map(len, took))
    for name, times in took.items():
        note = f"; {notes[name]}" if notes else ""
        print(f"{name:{width}}: median {statistics.median(times) * 1000:5.1f} ms (min {min(times) * 1000:.1f}, "
              f"max {max(times) * 1000:.1f}; {len(times)} {noun}), {base / statistics.median(times):.2f}x {versus}{note}")
        figures.add_median(name, [t * 1000 for t in times], "ms", baseline=base * 1000, **context)


def bench_changes(rows: int, rounds: int, figures: Figures) -> None:
    from pyspark.sql import functions as F

    from spark_jobs.runtime.commits import barrier_txn
    from spark_jobs.runtime.delta_log import appended_files, change_feed, read_files

    with scratch_spark("bench-changes") as (spark, scratch):
        path = f"{scratch}/bids"
        spark.range(rows).selectExpr("id AS auction", "id % 100000 AS bidder", "id * 3 AS price", "current_timestamp() AS ts") \
            .write.format("delta").option("delta.enableChangeDataFeed", "true").save(path)
        for barrier in range(1, rounds + 3):  # two more to warm up
            with barrier_txn(spark, "bids#g0", barrier, json.dumps({"barrier": barrier}), None):
                spark.range(5000).selectExpr("id * 7 AS auction", "id % 1000 AS bidder", "id AS price",
                                             "current_timestamp() AS ts").write.format("delta").mode("append").save(path)

        def feed(version: int) -> DataFrame:
            return change_feed(spark, path, version - 1, version, "_weight").drop("_weight")

        def commit_files(version: int) -> DataFrame:
            found = appended_files(spark, path, version - 1, version)
            assert found is not None, "an append read as one"
            return read_files(spark, *found)

        took: dict[str, list[float]] = {"change data feed": [], "commit's files": []}
        for version in range(1, rounds + 3):
            ways = [("change data feed", feed), ("commit's files", commit_files)]
            for name, read in ways if version % 2 else ways[::-1]:
                started = time.perf_counter()
                rows_read = read(version).agg(F.count(F.lit(1)), F.sum(F.hash("auction", "bidder", "price"))).first()
                if version > 2:
                    took[name].append(time.perf_counter() - started)
                assert rows_read is not None and rows_read[0] == 5000
    print_medians(took, "change data feed", "reads", "the feed", figures, which="changes")


def bench_reads(rows: int, rounds: int, figures: Figures) -> None:
    from pyspark.sql import functions as F

    from spark_jobs.runtime.delta_log import read_version, version_files

    with scratch_spark("bench-reads") as (spark, scratch):
        path = f"{scratch}/t"
        for i in range(40):  # 40 versions of one file each: the checksum lists 40 files
            spark.range(i * rows // 40, (i + 1) * rows // 40, numPartitions=1).selectExpr("id AS k", "id % 1000 AS v") \
                .write.format("delta").mode("append").save(path)
        version = 39

        def time_travel() -> DataFrame:
            return spark.read.format("delta").option("versionAsOf", version).load(path)

        def lockstep() -> DataFrame:
            return read_version(spark, path, version)

        took: dict[str, list[float]] = {"Delta's time travel": [], "read_version": [], "its checksum read": []}
        for round_ in range(rounds + 2):  # two more to warm up
            ways = [("Delta's time travel", time_travel), ("read_version", lockstep)]
            for name, way in ways if round_ % 2 else ways[::-1]:
                started = time.perf_counter()
                found = way().agg(F.count(F.lit(1)), F.sum("v")).first()
                assert found is not None and found[0] == rows
                if round_ > 1:
                    took[name].append(time.perf_counter() - started)
            started = time.perf_counter()
            assert version_files(spark, path, version) is not None
            if round_ > 1:
                took["its checksum read"].append(time.perf_counter() - started)
    print_medians(took, "Delta's time travel", "reads", "time travel", figures, which="reads")


def bench_commits(rows: int, rounds: int, tz: str, pause: float, figures: Figures) -> None:
    import os

    from spark_jobs.runtime.commits import DeltaSink
    from spark_jobs.runtime.stopwatch import Stopwatch

    os.environ["TZ"] = tz  # the JVM Spark starts next inherits it as its default time zone
    check = "spark.databricks.delta.allFilesInCrc.verificationMode.forceOnNonUTC.enabled"
    with scratch_spark("bench-commits") as (spark, scratch):
        print(f"JVM time zone {spark._jvm.java.util.TimeZone.getDefault().getID()}, "  # type: ignore[union-attr]
              f"Spark session's {spark.conf.get('spark.sql.session.timeZone')}")
        delta_default = spark.newSession()
        delta_default.conf.set(check, "true")
        ddl = "id BIGINT, v BIGINT, ts TIMESTAMP"
        sinks = {"Delta's default (checked)": DeltaSink(delta_default, f"{scratch}/checked", "checked", ddl),
                 "Lockstep's session": DeltaSink(spark, f"{scratch}/lockstep", "lockstep", ddl)}
        took: dict[str, list[float]] = {name: [] for name in sinks}
        spent: dict[str, dict[str, list[int]]] = {name: {} for name in sinks}
        for barrier in range(1, rounds + 4):  # three more to warm up
            order = list(sinks.items()) if barrier % 2 else list(sinks.items())[::-1]
            for name, sink in order:
                frame = sink.spark.range(barrier * rows, (barrier + 1) * rows).selectExpr(
                    "id", "id % 7 AS v", "current_timestamp() AS ts")
                watch = Stopwatch()
                started = time.perf_counter()
                sink.commit(barrier, 0, functools.partial(frame.write.format("delta").mode("append").save, sink.path),
                            watch=watch)
                if barrier > 3:
                    took[name].append(time.perf_counter() - started)
                    for phase in watch.phases():
                        spent[name].setdefault(phase.name, []).append(phase.ms)
                time.sleep(pause)  # between barriers: the upkeep after the last commit runs in it
        for sink in sinks.values():
            sink.close()
    where = {name: "median ms per phase: " + ", ".join(f"{p} {statistics.median(ms):.0f}" for p, ms in phases.items())
             for name, phases in spent.items()}
    print_medians(took, "Delta's default (checked)", "commits", "the default", figures, where, which="commits", tz=tz)
    for name, by_phase in spent.items():
        for phase, ms in by_phase.items():
            figures.add_median(f"{name}: {phase}", ms, "ms", which="commits", tz=tz)
