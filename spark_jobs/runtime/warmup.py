"""Make the Spark driver's class archive (``spark_jobs.runtime.jvm``): one session that does
what a job does — Delta creates, barrier-stamped appends, history, MERGE, change-feed reads,
aggregates, a streaming query with ``foreachBatch``, the Kafka source's planning —
with ``-XX:ArchiveClassesAtExit``, so the JVM writes the classes it loaded when it exits.

``scripts/setup`` runs it when the archive is missing (about 30 s, once per Java, pyspark and
jar set); running it again rebuilds the archive.

Usage: python -m spark_jobs.runtime.warmup
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from coordinator.settings import Settings
from spark_jobs.runtime.jvm import BASE_OPTIONS, QUIET_CDS, archive_path


def exercise(spark: object, folder: Path) -> None:
    """Load the classes a Lockstep job loads: every kind of Spark work it does, on tiny data."""
    from delta.tables import DeltaTable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from spark_jobs.runtime.commits import TABLE_PROPERTIES, barrier_txn

    assert isinstance(spark, SparkSession)
    path = str(folder / "t")
    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(
        spark.createDataFrame([], "k BIGINT, v BIGINT").schema)
    for key, value in TABLE_PROPERTIES.items():
        builder = builder.property(key, value)
    builder.execute()
    for b in (1, 2):
        with barrier_txn(spark, "warmup#g0", b, f'{{"barrier": {b}}}'):
            spark.range(100).selectExpr("id % 7 AS k", f"id * {b} AS v").write.format("delta").mode("append").save(path)
    DeltaTable.forPath(spark, path).history().select("version", "userMetadata").collect()
    changes = spark.range(10).selectExpr("id AS k", "id AS v")
    (DeltaTable.forPath(spark, path).alias("t").merge(changes.alias("s"), "t.k = s.k")
     .whenMatchedUpdate(set={"v": "s.v"}).whenNotMatchedInsert(values={"k": "s.k", "v": "s.v"}).execute())
    (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 1).load(path)
     .groupBy("k", "_change_type").agg(F.sum("v"), F.count(F.lit(1))).collect())
    spark.read.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9").option("subscribe", "warmup").load()
    sink = str(folder / "s")
    query = (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
             .writeStream.foreachBatch(lambda frame, _: frame.write.format("delta").mode("append").save(sink))
             .option("checkpointLocation", str(folder / "checkpoint")).trigger(processingTime="200 milliseconds").start())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (query.lastProgress is None or query.lastProgress["batchId"] < 2):
        time.sleep(0.2)
    query.stop()
    spark.sql(f"OPTIMIZE delta.`{path}`").collect()


def build(settings: Settings) -> Path:
    """Run the exercise in a JVM that writes the archive at exit; the archive, in place once whole."""
    from spark_jobs.runtime.session import build_session

    target = archive_path(settings)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        options = f"{BASE_OPTIONS} -XX:ArchiveClassesAtExit={partial} {QUIET_CDS}"
        spark = build_session("lockstep-warmup", settings=settings,
                              conf={"spark.driver.extraJavaOptions": options, "spark.sql.warehouse.dir": tmp})
        gateway = spark.sparkContext._gateway  # type: ignore[attr-defined]
        try:
            exercise(spark, Path(tmp))
        finally:
            spark.stop()
            process = getattr(gateway, "proc", None)
            if process is not None:  # the JVM exits when its stdin closes, and writes the archive then
                process.stdin.close()
                process.wait(300)
    if not partial.is_file() or partial.stat().st_size == 0:
        raise RuntimeError(f"the JVM wrote no class archive at {partial}")
    partial.replace(target)
    for stale in target.parent.glob("spark-*.jsa"):  # archives of another Java, pyspark or jar set
        if stale != target:
            stale.unlink()
    return target


def main() -> None:
    settings = Settings.from_env()
    began = time.monotonic()
    target = build(settings)
    print(f"class archive for the Spark driver: {target} ({target.stat().st_size / 1e6:.0f} MB, "
          f"{time.monotonic() - began:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
