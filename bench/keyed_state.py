"""Spark's own keyed state (the RocksDB state store) kept across barriers, for two Nexmark
queries whose barriers touch random old keys, against a full refresh of the same query in the
same run: Spark's state store outside Lockstep's maintenance, to see what each part costs. (q20
is kept this way by ``WITH ('state' = 'keyed')``, measured end to end by ``bench.nexmark``;
aggregates such as q17 are not yet.)

* ``q20`` (bids JOIN auctions of category 10): a stream-stream inner join; each side's rows are
  kept in the state by join key, so a new bid finds its auction by a lookup and a new auction
  its earlier bids; the join's new rows are appended to the result (``append`` mode).
* ``q17`` (auction statistics per day): a streaming aggregation; each group's running COUNT,
  MIN, MAX, SUM and AVG are kept in the state, and only the groups a barrier changed are
  emitted and MERGEd into the result by key (``update`` mode).

Micro-batches must coincide with barriers, and Delta's streaming source cannot stop at a
version, so each barrier's new rows of each source the query reads are staged: written as plain
Parquet files (``--staging parquet``, read by Spark's file stream source, which deletes them
once a batch processed them) or appended to a staging Delta table (``--staging delta``, one
txn-marked version per barrier). ``--trigger once`` runs the query once per barrier
(``availableNow``: the state is loaded from the checkpoint every barrier); ``live`` keeps one
query running and waits for it to process the staged barrier (``processAllAvailable``).

Prints, per barrier: staging, the micro-batch (Spark's ``durationMs`` phases, of which
``addBatch`` includes the sink's write), the state's rows and commit time, the full refresh;
then medians (min-max), the ratio, the state's size on disk and the bootstrap time.

Usage: python -m bench.keyed_state [--events 1000000] [--per-barrier 5000] [--rounds 5] [--query q20] [--trigger live]
       [--staging parquet]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.nexmark import PIPELINE, events
from bench.results import Figures, add_json_flag
from bench.stack import JARS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

SOURCES = {"q20": ("bid", "auction"), "q17": ("bid",)}


def query(name: str) -> str:
    """The query of table ``name`` in pipelines/nexmark.sql (what ``lockstep run`` maintains)."""
    from spark_jobs.planning.pipeline import parse_pipeline

    return parse_pipeline(PIPELINE.read_text()).table(name).query


class KeyedQuery:
    """One query kept by a streaming query over the staging tables, one micro-batch a barrier."""

    def __init__(self, spark: SparkSession, name: str, home: Path, trigger: str, staging: str) -> None:
        self.spark, self.name, self.home, self.trigger, self.staging = spark, name, home, trigger, staging
        self.result = str(home / f"{name}_keyed")
        self.checkpoint = home / f"{name}_checkpoint"
        self.running: StreamingQuery | None = None
        self.write_s = 0.0

    def _sink(self, frame: DataFrame, batch_id: int) -> None:
        """Append (join) or MERGE by key (aggregate) the batch's rows, txn-marked by batch."""
        from delta.tables import DeltaTable

        t0 = time.perf_counter()
        if self.name == "q17" and DeltaTable.isDeltaTable(self.spark, self.result):
            (DeltaTable.forPath(self.spark, self.result).alias("t")
             .merge(frame.alias("s"), "t.auction = s.auction AND t.day = s.day")
             .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        else:
            (frame.write.format("delta").mode("append").option("txnAppId", f"{self.name}_keyed")
             .option("txnVersion", batch_id).save(self.result))
        self.write_s = time.perf_counter() - t0

    def _start(self, available_now: bool) -> StreamingQuery:
        session = self.spark.newSession()  # the streams as the query's tables
        for source in SOURCES[self.name]:
            reader = session.readStream.option("maxFilesPerTrigger", 1_000_000)
            if self.staging == "parquet":  # the source's schema, from its Delta table
                schema = self.spark.read.format("delta").load(str(self.home / source)).schema
                reader = reader.format("parquet").schema(schema).option("cleanSource", "delete")
            staged = self.home / f"stage_{source}"
            reader.format(self.staging).load(str(staged / "*" if self.staging == "parquet" else staged)) \
                .createOrReplaceTempView(source)
        writer = (session.sql(query(self.name)).writeStream.foreachBatch(self._sink)
                  .outputMode("update" if self.name == "q17" else "append")
                  .option("checkpointLocation", str(self.checkpoint)))
        return (writer.trigger(availableNow=True) if available_now else
                writer.trigger(processingTime="20 milliseconds")).start()

    def barrier(self) -> dict[str, Any]:
        """Process what was staged; Spark's progress of the batch."""
        if self.trigger == "once":
            query = self._start(available_now=True)
            query.awaitTermination()
        else:
            self.running = query = self.running or self._start(available_now=False)
            query.processAllAvailable()
        return query.lastProgress or {}

    def stop(self) -> None:
        if self.running:
            self.running.stop()


def _state(progress: dict[str, Any]) -> tuple[int, int]:
    """The state's rows and its commit time (ms) in a batch's progress."""
    operators = progress.get("stateOperators") or []
    return sum(o["numRowsTotal"] for o in operators), sum(o.get("commitTimeMs", 0) for o in operators)


def _phases(progress: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in (progress.get("durationMs") or {}).items() if v >= 20 and k != "triggerExecution")


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="events before the first barrier (default 1,000,000)")
    parser.add_argument("--per-barrier", type=int, default=5000, help="new events per barrier (default 5,000)")
    parser.add_argument("--rounds", type=int, default=5, help="barriers measured (default 5)")
    parser.add_argument("--query", choices=sorted(SOURCES), default="q20", help="the query (default q20)")
    parser.add_argument("--trigger", choices=["live", "once"], default="live",
                        help="live: one running query; once: an availableNow query per barrier (default live)")
    parser.add_argument("--staging", choices=["parquet", "delta"], default="parquet",
                        help="how a barrier's new rows reach the query (default parquet)")
    add_json_flag(parser)
    args = parser.parse_args()
    if args.events % 50 or args.per_barrier % 50 or args.per_barrier <= 0:
        parser.error("--events and --per-barrier must be multiples of 50 (Nexmark's mix), --per-barrier above 0")
    figures = Figures("keyed_state", args)
    with tempfile.TemporaryDirectory() as tmp:
        run(Path(tmp), args.events, args.per_barrier, args.rounds, args.query, args.trigger, args.staging, figures)
    figures.write()


def run(home: Path, initial: int, per_barrier: int, rounds: int, name: str, trigger: str, staging: str,
        figures: Figures) -> None:
    from coordinator.settings import Settings
    from spark_jobs.runtime.maintenance.keyed import ROCKSDB
    from spark_jobs.runtime.session import build_session

    settings = Settings(warehouse=str(home / "wh"), home=home, jars=JARS)
    spark = build_session("bench-keyed-state", settings=settings, conf={
        "spark.driver.memory": "6g", "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"})

    def append(barrier: int, start: int, count: int) -> float:
        """The events to each source table, then the query's sources' to staging: the time staging took."""
        spent = 0.0
        for source, frame in events(spark, start, count).items():
            frame = frame.cache()
            (frame.write.format("delta").mode("append").option("txnAppId", source).option("txnVersion", barrier)
             .save(str(home / source)))
            t0 = time.perf_counter()
            if source in SOURCES[name] and staging == "delta":
                (frame.write.format("delta").mode("append").option("txnAppId", f"stage_{source}")
                 .option("txnVersion", barrier).save(str(home / f"stage_{source}")))
            elif source in SOURCES[name]:  # a folder per barrier: a retried barrier overwrites its own files
                frame.write.mode("overwrite").parquet(str(home / f"stage_{source}" / f"b{barrier}"))
            spent += time.perf_counter() - t0
            frame.unpersist()
        return spent

    def full_refresh() -> float:
        t0 = time.perf_counter()
        session = spark.newSession()
        for source in SOURCES[name]:
            session.read.format("delta").load(str(home / source)).createOrReplaceTempView(source)
        session.sql(query(name)).write.format("delta").mode("overwrite").save(str(home / f"{name}_full"))
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    append(1, 0, initial)
    print(f"{initial:,} events written (sources and staging) in {time.perf_counter() - t0:.1f}s; "
          f"then {per_barrier:,} per barrier")
    keyed = KeyedQuery(spark, name, home, trigger, staging)
    t0 = time.perf_counter()
    progress = keyed.barrier()
    bootstrap = time.perf_counter() - t0
    print(f"bootstrap (all rows into the state, the first result): {bootstrap:.1f}s, "
          f"state rows {_state(progress)[0]:,}")
    context = {"query": name, "events": initial, "per_barrier": per_barrier, "trigger": trigger, "staging": staging}
    figures.add("bootstrap", bootstrap, "s", state_rows=_state(progress)[0], **context)
    full_refresh()  # warm-up
    times: dict[str, list[float]] = {"staging": [], "keyed": [], "full refresh": []}
    spans: dict[str, list[float]] = {}  # the keyed batch's phases (ms) at each barrier
    for b in range(2, rounds + 2):
        times["staging"].append(append(b, initial + (b - 2) * per_barrier, per_barrier))
        t0 = time.perf_counter()
        progress = keyed.barrier()
        times["keyed"].append(time.perf_counter() - t0)
        times["full refresh"].append(full_refresh())
        rows, commit_ms = _state(progress)
        for phase, ms in {**(progress.get("durationMs") or {}), "sink write": keyed.write_s * 1000,
                          "state commit": commit_ms}.items():
            spans.setdefault(phase, []).append(ms)
        print(f"barrier {b}: keyed {times['keyed'][-1]:.2f}s ({_phases(progress)}; sink write {keyed.write_s * 1000:.0f} ms;"
              f" state {rows:,} rows, commit {commit_ms} ms), staging {times['staging'][-1]:.2f}s,"
              f" full refresh {times['full refresh'][-1]:.2f}s", flush=True)
    keyed.stop()
    inc = statistics.median(times["keyed"]) + statistics.median(times["staging"])
    full = statistics.median(times["full refresh"])
    state_mb = _size_mb(keyed.checkpoint)
    print(f"\n{name} at {initial:,} events, trigger {trigger}, staging {staging}: keyed {_spread(times['keyed'])} + staging "
          f"{_spread(times['staging'])}; full refresh {_spread(times['full refresh'])}; full / (keyed + staging) "
          f"{full / inc:.1f}x; state on disk {state_mb:.1f} MB")
    for what in times:
        figures.add_median(f"{what} per barrier", times[what], "s", **context)
    figures.add("keyed + staging per barrier", inc, "s", baseline=full, **context)
    figures.add("state on disk", state_mb, "MB", **context)
    for phase, ms in spans.items():
        if phase != "triggerExecution":
            figures.add_median(f"keyed {phase}", ms, "ms", **context)
    spark.stop()


if __name__ == "__main__":
    main()
