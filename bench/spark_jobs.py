"""Data-plane benchmarks, each against a baseline measured in the same run.

* ``ingest``: root ingestion (JSON, primary-key MERGE) of the same Kafka records in the same
  batch sizes, Lockstep's RootIngestion vs. a plain Structured Streaming Kafka -> Delta MERGE
  job (foreachBatch: parse, last change per key, MERGE). Runs alternate; the best of each counts.
* ``ivm``: barriers of a query (``--query``: an aggregate, HAVING, Top-3 per group, DISTINCT,
  star joins) over a source table of ``--rows`` rows (several sizes: one after the other, in
  one run) of which a fixed number changed per barrier, incremental maintenance vs. full
  refresh of the same query. ``--changes spread``: the changed rows are anywhere in the table
  (every file holds every group); ``recent``: among its newest rows, as a stream's updates and
  late rows mostly are, in a table written in key order (groups are runs of keys).
* ``changes``: reading one appended version's rows (what an incremental job does 1-4 times a
  barrier) from the files its commit added (``delta_log.appended_files``, Lockstep's way) vs.
  Delta's change data feed, over a source table of ``--rows`` rows that took a barrier's
  append ``--rounds`` times. The two alternate; medians and spread.
* ``reads``: reading a version of a table of 40 files (what every snapshot read and every
  incremental barrier does): Delta's time travel (baseline) vs. Lockstep's ``read_version``
  (the version's files from its checksum file), and the checksum read alone; alternating.
* ``commits``: a barrier's txn-marked append of ``--rows`` rows (``DeltaSink.commit``, with its
  upkeep between barriers) in a JVM whose time zone is ``--tz``, with Delta's default check of
  the checksum's file list in non-UTC zones (baseline) vs. Lockstep's session, which turns it
  off. Two tables, commits alternating, ``--pause`` s apart; medians, spread and the sink's
  phases (``upkeep``: waiting for the work after the last commit, which the pause hides).

* ``python``: barriers of a Python table (a row-wise function with a pandas UDF) over a source
  of ``--rows`` rows that grows by ``--changed`` rows a barrier: applied to the new rows only
  (``PlanKind.ROW_WISE``) vs. recomputed over the whole source (full refresh), same function.
  ``--keyed``: the source has a key and ``--changed`` of its rows are updated a barrier
  (anywhere, or ``--changes recent``: the last keys): the function over the changed rows,
  MERGEd by key, vs. recomputed. ``--udf-rounds K`` makes the UDF a costlier model.

Usage: python -m bench.spark_jobs {ingest,ivm,changes,reads,commits,python} [--records N] [--rows N [N ...]] [--query having]
       [--keyed]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from typing import TYPE_CHECKING

from bench.code_path import describe, traced
from bench.delta_io import bench_changes, bench_commits, bench_reads, print_medians
from bench.results import Figures, add_json_flag
from bench.stack import local_stack
from coordinator.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_jobs.runtime.ivm import TableMaintainer

INGEST_DDL = "id BIGINT, v BIGINT, name STRING"
FILE_ROWS = 250_000  # ivm: rows per source file (a stream's barriers write files of this order)
# ivm's queries over src(k, g, v) (100 rows per group g, v = k % 1000), dim_g(g, label) (100
# labels) and dim_v(v, name)
IVM_QUERIES = {
    "aggregate": "SELECT g, SUM(v) AS total, COUNT(*) AS n, AVG(v) AS mean FROM src GROUP BY g",
    "global": "SELECT COUNT(*) AS n, SUM(v) AS total, AVG(v) AS mean FROM src",  # one row, no GROUP BY
    "having": "SELECT g, COUNT(*) AS n, SUM(v) AS total FROM src GROUP BY g HAVING SUM(v) > 50000",
    "top3": "SELECT * FROM (SELECT g, k, v, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v DESC, k) AS rn FROM src) "
            "WHERE rn <= 3",
    "distinct": "SELECT DISTINCT g, v FROM src",
    "star": "SELECT s.k, d.label, e.name FROM src s JOIN dim_g d ON s.g = d.g JOIN dim_v e ON s.v = e.v",
    "star_aggregate": "SELECT d.label, COUNT(*) AS n, SUM(s.v) AS total FROM src s JOIN dim_g d ON s.g = d.g "
                      "JOIN dim_v e ON s.v = e.v GROUP BY d.label",
}


def produce(bootstrap: str, topic: str, records: int, keys: int) -> dict[int, int]:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from coordinator.client.topics import create_topics

    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_topics(admin, [NewTopic(topic, 2, 1)])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000})
    for i in range(records):
        key = i % keys
        value = json.dumps({"id": key, "v": i, "name": f"n{i % 97}"}).encode()
        while True:
            try:
                producer.produce(topic, key=str(key).encode(), value=value)
                break
            except BufferError:  # the local queue is full: let deliveries drain
                producer.poll(0.5)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(120)
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench"})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in (0, 1)}
    consumer.close()
    return ends


def plain_merge_job(spark: SparkSession, bootstrap: str, topic: str, path: str, per_batch: int, checkpoint: str) -> None:
    """The baseline: what a team writes by hand for Kafka -> Delta upserts."""
    from delta.tables import DeltaTable
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    DeltaTable.createIfNotExists(spark).location(path).addColumns(spark.createDataFrame([], INGEST_DDL).schema).execute()

    def upsert(frame: DataFrame, batch_id: int) -> None:
        rows = frame.select("partition", "offset", F.from_json(F.col("value").cast("string"), INGEST_DDL).alias("r"))
        rows = rows.where("r.id IS NOT NULL")
        last = Window.partitionBy("r.id").orderBy(F.col("offset").desc())
        rows = rows.withColumn("_rank", F.row_number().over(last)).where("_rank = 1").select("r.*")
        (DeltaTable.forPath(spark, path).alias("t").merge(rows.alias("s"), "t.id = s.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())

    query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", per_batch).load()
             .writeStream.foreachBatch(upsert).option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()


def lockstep_ingest(spark: SparkSession, settings: Settings, topic: str, ends: dict[int, int], batches: int, run: str) -> None:
    from coordinator.domain import OffsetRange
    from coordinator.domain.work import BarrierWork
    from spark_jobs.planning.pipeline import parse_pipeline
    from spark_jobs.runtime.commits import CompletionPublisher
    from spark_jobs.runtime.ingest import RootIngestion
    from spark_jobs.runtime.kafka_ranges import kafka_source_options

    sql = f"CREATE TABLE t_{run} ({INGEST_DDL}) WITH ('source' = 'kafka:{topic}', 'primary_key' = 'id')"
    table = parse_pipeline(sql).roots[0]
    job = RootIngestion(spark.newSession(), table, f"ingest_{run}", settings.table_location, CompletionPublisher(settings),
                        kafka_source_options(settings))
    for b in range(1, batches + 1):
        offsets = [OffsetRange(topic, p, end * (b - 1) // batches, end * b // batches) for p, end in ends.items()]
        job.process(BarrierWork(b, 0, 0, offsets=offsets))


def bench_ingest(records: int, batches: int, repeat: int, figures: Figures) -> None:
    from spark_jobs.runtime.session import build_session

    with local_stack() as settings:
        tmp = settings.home
        t0 = time.perf_counter()
        ends = produce(settings.bootstrap, "ingest_src", records, keys=records // 4)
        print(f"produced {records:,} JSON records (2 partitions, {records // 4:,} keys) in {time.perf_counter() - t0:.1f}s; "
              f"{batches} batches of ~{records // batches:,}")
        spark = build_session("bench-ingest", settings=settings)
        plain: list[float] = []
        ours: list[float] = []
        for r in range(repeat):
            t0 = time.perf_counter()
            plain_merge_job(spark, settings.bootstrap, "ingest_src", str(tmp / f"plain{r}"), records // batches,
                            str(tmp / f"ckpt{r}"))
            plain.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            lockstep_ingest(spark, settings, "ingest_src", ends, batches, str(r))
            ours.append(time.perf_counter() - t0)
            print(f"run {r + 1}: plain Structured Streaming MERGE {plain[-1]:6.1f}s, "
                  f"Lockstep root ingestion {ours[-1]:6.1f}s")
        count = spark.read.format("delta").load(settings.table_location(f"t_{repeat - 1}")).count()
        best_plain, best_ours = min(plain), min(ours)
        print(f"rows in the table: {count:,} (both jobs upsert the same keys)")
        print(f"plain    : {records / best_plain:10,.0f} records/s (best of {repeat})")
        print(f"lockstep : {records / best_ours:10,.0f} records/s (best of {repeat})")
        print(f"ratio lockstep / plain throughput: {best_plain / best_ours:.2f}")
        figures.add("plain throughput", records / best_plain, "records/s", which="ingest", best_of=repeat)
        figures.add("lockstep throughput", records / best_ours, "records/s", baseline=records / best_plain,
                    ratio=best_plain / best_ours, which="ingest", best_of=repeat)
        spark.stop()


def bench_ivm(sizes: list[int], changed: float, rounds: int, which: str, rewrite_limit_mb: int | None,
              spread: bool, figures: Figures) -> None:
    from spark_jobs.runtime.session import build_session

    medians: dict[int, dict[str, float]] = {}
    with local_stack() as settings:
        spark = build_session("bench-ivm", settings=settings, conf={"spark.driver.memory": "6g"})
        for rows in sizes:
            print(f"--- {rows:,} source rows")
            medians[rows] = ivm_at(spark, settings, rows, int(rows * changed) if changed < 1 else int(changed),
                                   rounds, which, rewrite_limit_mb, spread, figures)
        spark.stop()
    print(f"{'source rows':>12} {'incremental':>12} {'full refresh':>13} {'full / incr':>12}")
    for rows, m in medians.items():
        ratio = m["full refresh"] / m["incremental"]
        print(f"{rows:>12,} {m['incremental']:>11.2f}s {m['full refresh']:>12.2f}s {ratio:>11.1f}x")
    if len(sizes) > 1:
        first, last = medians[sizes[0]], medians[sizes[-1]]
        print(f"incremental at {sizes[-1]:,} rows / at {sizes[0]:,}: {last['incremental'] / first['incremental']:.2f}x; "
              f"full refresh: {last['full refresh'] / first['full refresh']:.2f}x")
        for how in first:
            figures.add(f"{how} at {sizes[-1]:,} rows / at {sizes[0]:,}", last[how] / first[how], "x", which="ivm", query=which)


def ivm_at(spark: SparkSession, settings: Settings, rows: int, n_changed: int, rounds: int, which: str,
           rewrite_limit_mb: int | None, spread: bool, figures: Figures) -> dict[str, float]:
    """One size: the source and its dimensions written, both jobs' first barrier and one more
    to warm up, then ``rounds`` barriers of ``n_changed`` updated rows; the median seconds per
    barrier of each."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from coordinator.domain.work import BarrierWork
    from spark_jobs.planning.pipeline import DerivedTable
    from spark_jobs.planning.plan import Plan, PlanKind, TableShape
    from spark_jobs.planning.plans import plan_query
    from spark_jobs.runtime.commits import CompletionPublisher, DeltaSink
    from spark_jobs.runtime.ivm import TableMaintainer
    from spark_jobs.runtime.maintenance.table import REWRITE_LIMIT_BYTES

    query = IVM_QUERIES[which]
    rewrite_limit = REWRITE_LIMIT_BYTES if rewrite_limit_mb is None else rewrite_limit_mb << 20
    groups = rows // 100
    group_of = (lambda k: k % groups) if spread else (lambda k: k / 100)  # noqa: E731
    run = f"{rows}"
    source = DeltaSink(spark, settings.table_location(f"src_{run}"), f"ingest_src_{run}", "k BIGINT, g BIGINT, v BIGINT")
    t0 = time.perf_counter()
    version = source.commit(1, 0, lambda: spark.range(rows).select(
        F.col("id").alias("k"), group_of(F.col("id")).cast("bigint").alias("g"), (F.col("id") % 1000).alias("v"))
        .write.format("delta").option("maxRecordsPerFile", FILE_ROWS).mode("append").save(source.path))
    print(f"source: {rows:,} rows, {groups:,} groups, {-(-rows // FILE_ROWS)} files or more, "
          f"written in {time.perf_counter() - t0:.1f}s")
    locations = {"src": source.path}
    versions = {"src": version}
    for name, ddl, frame in (("dim_g", "g BIGINT, label BIGINT", spark.range(groups).select(
                                  F.col("id").alias("g"), (F.col("id") % 100).alias("label"))),
                             ("dim_v", "v BIGINT, name STRING", spark.range(1000).select(
                                  F.col("id").alias("v"), F.concat(F.lit("v"), F.col("id")).alias("name")))):
        if name in query:
            dim = DeltaSink(spark, settings.table_location(f"{name}_{run}"), f"ingest_{name}_{run}", ddl)
            versions[name] = dim.commit(1, 0, lambda d=dim, f=frame: f.write.format("delta").mode("append").save(d.path))
            locations[name] = dim.path
    locate = lambda table: locations.get(table) or settings.table_location(table)  # noqa: E731
    publisher = CompletionPublisher(settings)
    keys = {"src": ("k",), "dim_g": ("g",), "dim_v": ("v",)}
    incremental_plan = plan_query(query, {t: TableShape(keys[t], False) for t in versions})
    full_plan = Plan(PlanKind.FULL_REFRESH, "the baseline", query, sources=tuple(sorted(versions)))
    print(f"{which}: {incremental_plan.explain()}")
    assert incremental_plan.incremental
    jobs = {
        "incremental": TableMaintainer(spark, DerivedTable(f"inc_{run}", query, full_plan.sources), incremental_plan,
                                       f"maintain_inc_{run}", locate, publisher, rewrite_limit_bytes=rewrite_limit),
        "full refresh": TableMaintainer(spark, DerivedTable(f"full_{run}", query, full_plan.sources), full_plan,
                                        f"maintain_full_{run}", locate, publisher),
    }
    for job in jobs.values():
        job.process(BarrierWork(1, 0, 0, source_versions=versions))
    times: dict[str, list[float]] = {name: [] for name in jobs}
    window = rows if spread else min(rows, n_changed * 10)  # where the changed keys are: the newest rows
    for b in range(2, rounds + 3):  # barrier 2 warms the JVM up for this size: not counted
        updates = spark.range(n_changed).select(
            (rows - 1 - (F.col("id") * 7919 + b * 104729) % window).alias("k")).distinct().select(
            "k", group_of(F.col("k")).cast("bigint").alias("g"), (F.lit(b) * 13 + F.col("k") % 17).alias("v"))
        versions["src"] = source.commit(b, 0, lambda u=updates: DeltaTable.forPath(spark, source.path).alias("t")
                                        .merge(u.alias("s"), "t.k = s.k").whenMatchedUpdateAll().execute())
        for name, job in jobs.items():
            t0 = time.perf_counter()
            work = BarrierWork(b, 0, 0, source_versions=versions)
            if name == "incremental" and b == rounds + 2:  # the last one: the modules its code path crosses
                _, path = traced(functools.partial(job.process, work))
            else:
                job.process(work)
            if b > 2:
                times[name].append(time.perf_counter() - t0)
        if b > 2:
            print(f"barrier {b}: {n_changed:,} rows changed; " +
                  "  ".join(f"{name} {times[name][-1]:6.2f}s ({phases(job)}{way(job)})" for name, job in jobs.items()))
    inc = spark.read.format("delta").load(jobs["incremental"].sink.path)
    columns = [c for c in inc.columns if c != "mean" and not c.startswith("__")]  # (AVG's last digits differ)
    inc = inc.select(*columns)
    full = spark.read.format("delta").load(jobs["full refresh"].sink.path).select(*columns)
    same = inc.exceptAll(full).count() == 0 and full.exceptAll(inc).count() == 0
    for job in jobs.values():
        job.close()
    median = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"results identical: {same}")
    print(f"median per barrier: incremental {median['incremental']:.2f}s, full refresh {median['full refresh']:.2f}s "
          f"(spread {min(times['incremental']):.2f}-{max(times['incremental']):.2f}s, "
          f"{min(times['full refresh']):.2f}-{max(times['full refresh']):.2f}s)")
    print(f"ratio full refresh / incremental: {median['full refresh'] / median['incremental']:.1f}x")
    print(f"the last incremental barrier's code path (its time above includes the tracing): {describe(path)}")
    for name, ts in times.items():
        figures.add_median(f"{name} per barrier", ts, "s", baseline=median["full refresh"], which="ivm", query=which,
                           rows=rows, changed=n_changed, changes="spread" if spread else "recent", identical=same)
    return median


def bench_python(rows: int, n_new: int, rounds: int, keyed: bool, spread: bool, work: int, figures: Figures) -> None:
    """A row-wise Python table kept by appending each barrier's new rows (``keyed``: replacing
    the changed keys' rows) vs. recomputed."""
    import numpy as np
    import pandas as pd
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import DoubleType

    from coordinator.domain.work import BarrierWork
    from spark_jobs.planning.pipeline import DerivedTable
    from spark_jobs.planning.plan import Plan, PlanKind
    from spark_jobs.planning.python_tables import PythonTable
    from spark_jobs.runtime.commits import CompletionPublisher, DeltaSink
    from spark_jobs.runtime.ivm import TableMaintainer
    from spark_jobs.runtime.session import build_session

    def patience(v: pd.Series) -> pd.Series:
        x = v.astype("float64")
        for _ in range(work):  # a costlier model: ``--udf-rounds`` more vectorised steps per row
            x = np.sin(x) + v
        return 1.0 / (1.0 + v / 100.0) + 0.0 * x

    patience.__annotations__ = {"v": pd.Series, "return": pd.Series}  # (this module's are strings)
    score = pandas_udf(patience, DoubleType())

    def scored(src: DataFrame) -> DataFrame:
        return src.where("v % 10 <> 0").select("k", "v", score(F.col("v")).alias("score"))

    with local_stack() as settings:
        spark = build_session("bench-python", settings=settings)
        source = DeltaSink(spark, settings.table_location("src"), "ingest_src", "k BIGINT, v BIGINT")

        def append(b: int, first: int, n: int) -> int:
            frame = spark.range(first, first + n).select(F.col("id").alias("k"), (F.col("id") % 1000).alias("v"))
            return source.commit(b, 0, lambda: frame.write.format("delta").mode("append").save(source.path))

        def update(b: int, n: int) -> int:  # n rows anywhere in the source (or its last ones) get a new value
            keys = spark.range(n).select((F.rand(b) * rows).cast("long").alias("k")).dropDuplicates(["k"]) if spread \
                else spark.range(rows - n, rows).withColumnRenamed("id", "k")
            frame = keys.select("k", ((F.col("k") + b) % 1000).alias("v"))
            return source.commit(b, 0, lambda: DeltaTable.forPath(spark, source.path).alias("t").merge(
                frame.alias("s"), "t.k = s.k").whenMatchedUpdateAll().execute())

        versions = {"src": append(1, 0, rows)}
        publisher = CompletionPublisher(settings)
        python = PythonTable("scored", scored, ("src",), False, "", "bench", "scored")
        incremental = Plan(PlanKind.ROW_WISE, "bench", "scored", ("src",), key=("k",)) if keyed else \
            Plan(PlanKind.ROW_WISE, "bench", "scored", ("src",), append_only=True, inserts_only=True)
        plans = {"row-wise": incremental, "full refresh": Plan(PlanKind.FULL_REFRESH, "the baseline", "scored", ("src",))}
        jobs = {name: TableMaintainer(spark, DerivedTable(f"t_{i}", "scored", ("src",), python=python), plan,
                                      f"maintain_t_{i}", settings.table_location, publisher)
                for i, (name, plan) in enumerate(plans.items())}
        times: dict[str, list[float]] = {name: [] for name in jobs}
        for b in range(1, rounds + 3):  # barrier 1 makes the tables, barrier 2 warms up: not counted
            if b > 1:
                versions["src"] = update(b, n_new) if keyed else append(b, rows + (b - 2) * n_new, n_new)
            for name, job in jobs.items():
                t0 = time.perf_counter()
                work = BarrierWork(b, 0, 0, source_versions=dict(versions))
                if name == "row-wise" and b == rounds + 2:  # the last one: the modules its code path crosses
                    _, path = traced(functools.partial(job.process, work))
                else:
                    job.process(work)
                if b > 2:
                    times[name].append(time.perf_counter() - t0)
            if b > 2:
                print(f"barrier {b}: {n_new:,} {'updated' if keyed else 'new'} rows; " +
                      "  ".join(f"{name} {times[name][-1]:6.2f}s ({phases(job)})" for name, job in jobs.items()))
        print(f"the last row-wise barrier's code path (its time above includes the tracing): {describe(path)}")
        tables = [spark.read.format("delta").load(job.sink.path) for job in jobs.values()]
        same = tables[0].exceptAll(tables[1]).count() == 0 and tables[1].exceptAll(tables[0]).count() == 0
        for job in jobs.values():
            job.close()
        spark.stop()
    print(f"results identical: {same}")
    print_medians(times, "full refresh", "barriers", "full refresh", figures, which="python", keyed=keyed, identical=same)


def way(job: TableMaintainer) -> str:
    """``; recomputed`` where the incremental job found recomputing cheaper (``costs``); for a
    keyed table, ``; rewritten`` where it found rewriting its table cheaper than a MERGE, and
    ``; compacted`` where a changelog table was."""
    if job.plan.changelog:
        return "; compacted" if job.costs.appends == 0 else ""
    if job.plan.keyed:
        return "; rewritten" if job.costs.since_probe else ""
    return "; recomputed" if job.plan.incremental and job.recomputed else ""


def phases(job: TableMaintainer) -> str:
    """Where the job's last barrier went, e.g. ``plan 120 ms, write 2300 ms``."""
    return ", ".join(f"{p.name} {p.ms} ms" for p in job.watch.phases())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["ingest", "ivm", "changes", "reads", "commits", "python"])
    parser.add_argument("--records", type=int, default=400_000, help="ingest: records (default 400,000)")
    parser.add_argument("--batches", type=int, default=8, help="ingest: barriers / micro-batches (default 8)")
    parser.add_argument("--repeat", type=int, default=2, help="ingest: alternating runs of each (default 2)")
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000_000],
                        help="ivm: source rows, one or more sizes; changes, reads, commits: the first one (default "
                             "10,000,000)")
    parser.add_argument("--changed", type=float, default=0.01,
                        help="ivm: rows changed per barrier, a fraction of the source (< 1) or a number (default 0.01)")
    parser.add_argument("--changes", choices=["spread", "recent"], default="spread",
                        help="ivm, python --keyed: where the changed rows are (default spread: anywhere)")
    parser.add_argument("--udf-rounds", type=int, default=0,
                        help="python: extra vectorised steps per row in the UDF, a costlier model (default 0)")
    parser.add_argument("--keyed", action="store_true",
                        help="python: a keyed source whose rows are updated, not one that grows")
    parser.add_argument("--rounds", type=int, default=3, help="ivm, changes, reads, commits: rounds measured (default 3)")
    parser.add_argument("--tz", default="America/Los_Angeles", help="commits: the JVM's time zone (default America/Los_Angeles)")
    parser.add_argument("--pause", type=float, default=0.5,
                        help="commits: seconds between a table's commits (default 0.5; 0: back to back, so each "
                             "commit waits for the upkeep after the one before)")
    parser.add_argument("--rewrite-limit-mb", type=int, default=None,
                        help="ivm: a result up to this size is rewritten whole, a larger one MERGEd (default: the "
                             "jobs' 4; -1: always MERGE)")
    parser.add_argument("--query", choices=sorted(IVM_QUERIES), default="aggregate", help="ivm: the query (default aggregate)")
    add_json_flag(parser)
    args = parser.parse_args()
    figures = Figures("spark_jobs", args)
    if args.which == "ingest":
        bench_ingest(args.records, args.batches, args.repeat, figures)
    elif args.which == "changes":
        bench_changes(args.rows[0], args.rounds, figures)
    elif args.which == "reads":
        bench_reads(args.rows[0], args.rounds, figures)
    elif args.which == "commits":
        bench_commits(args.rows[0], args.rounds, args.tz, args.pause, figures)
    elif args.which == "python":
        bench_python(args.rows[0], int(args.changed) if args.changed >= 1 else int(args.rows[0] * args.changed), args.rounds,
                     args.keyed, args.changes == "spread", args.udf_rounds, figures)
    else:
        bench_ivm(args.rows, args.changed, args.rounds, args.query, args.rewrite_limit_mb, args.changes == "spread", figures)
    figures.write()


if __name__ == "__main__":
    main()
