"""Writing a keyed aggregate's changed groups into its Delta table, three ways, against a
rewrite of the whole table (the baseline) in the same run: the MERGE Lockstep runs, and a
MERGE into a table with deletion vectors and Parquet bloom filters on the key, whose target
condition lists the changed keys (so Delta marks the old rows deleted instead of rewriting
their files, and a scan may skip the row groups that cannot hold a changed key).

The table has ``--groups`` rows in key order, as a keyed aggregate's table is written. Each
round changes the groups a Nexmark barrier of 5,000 events changes: 90% of its draws among
the newest 100 keys, 10% anywhere (about 600 groups). Prints each way's median write (min-max),
its ratio to the rewrite, and where a MERGE's time went (Delta's scan and rewrite metrics).

Usage: python -m bench.keyed_writes [--groups 3000000] [--rounds 6]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench.results import Figures, add_json_flag

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

KEY = ["auction", "day"]
WAYS = ("rewrite", "merge", "merge with deletion vectors and bloom filters")


def table(spark: SparkSession, groups: int) -> DataFrame:
    """``groups`` rows of q17's shape, one per auction."""
    from pyspark.sql import functions as F

    return spark.range(groups).select(
        F.col("id").alias("auction"), F.lit("2026-11-28").alias("day"), (F.col("id") % 7).alias("total_bids"),
        (F.col("id") % 5).alias("rank1_bids"), F.col("id").alias("min_price"), F.col("id").alias("max_price"),
        (F.col("id") * 1.5).alias("avg_price"), F.col("id").alias("sum_price"))


def changed(spark: SparkSession, groups: int, draws: int = 4600) -> DataFrame:
    """The groups a barrier's bids change: mostly among the newest 100 auctions, some anywhere."""
    from pyspark.sql import functions as F

    auction = F.when(F.rand() < 0.9, groups - 1 - F.floor(F.rand() * 100)).otherwise(F.floor(F.rand() * groups))
    keys = spark.range(draws).select(auction.cast("long").alias("auction")).distinct()
    return table(spark, groups).join(keys, "auction").withColumn("total_bids", F.col("total_bids") + 1)


def write(spark: SparkSession, path: str, way: str, rows: DataFrame) -> None:
    """Write the changed ``rows`` into the table at ``path`` the ``way`` named."""
    from pyspark.sql import functions as F

    from spark_jobs.runtime.commits import merge_by_key
    from spark_jobs.runtime.session import session_conf

    if way == "rewrite":  # as ``upsert_groups`` rewrites a table
        old = spark.read.format("delta").load(path)
        kept = old.join(rows.select(*KEY), KEY, "left_anti")
        with session_conf(spark, {"spark.sql.shuffle.partitions": "1"}):
            kept.unionByName(rows).sortWithinPartitions(*KEY).write.format("delta").mode("overwrite").save(path)
    else:
        listed = F.col("t.auction").isin([r.auction for r in rows.select("auction").collect()]) if "bloom" in way else None
        merge_by_key(spark, path, rows, KEY, rows.columns, null_safe=True, target=listed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=3_000_000, help="rows of the table (default 3,000,000)")
    parser.add_argument("--rounds", type=int, default=6, help="writes per way; the first is a warm-up (default 6)")
    add_json_flag(parser)
    args = parser.parse_args()
    if args.groups < 1000 or args.rounds < 2:
        parser.error("--groups must be at least 1000 and --rounds at least 2")

    from delta.tables import DeltaTable

    from spark_jobs.runtime.session import build_session

    spark = build_session("bench-keyed-writes", conf={
        "spark.driver.memory": "6g", "spark.sql.parquet.pushdown.inFilterThreshold": "100000"})  # (an IN list reaches Parquet)
    figures = Figures("keyed_writes", args)
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as home:
        for way in WAYS:
            path = str(Path(home) / way.replace(" ", "_"))
            writer = table(spark, args.groups).sortWithinPartitions(*KEY).write.format("delta")
            if "bloom" in way:
                writer = writer.option("delta.enableDeletionVectors", "true") \
                    .option("parquet.bloom.filter.enabled#auction", "true").option("parquet.block.size", 4 << 20)
            writer.save(path)
            times[way] = []
            for _ in range(args.rounds):
                rows = changed(spark, args.groups).cache()
                count = rows.count()
                began = time.perf_counter()
                write(spark, path, way, rows)
                times[way].append(time.perf_counter() - began)
                rows.unpersist()
            metrics = DeltaTable.forPath(spark, path).history(1).collect()[0].operationMetrics
            where = f"; last MERGE: scan {metrics['scanTimeMs']} ms, rewrite {metrics['rewriteTimeMs']} ms, " \
                    f"files removed {metrics['numTargetFilesRemoved']}" if "scanTimeMs" in metrics else ""
            print(f"{way}: {count} groups a round, writes {', '.join(f'{t:.2f}' for t in times[way])} s{where}", flush=True)
            if where:
                for what, key, unit in (("scan", "scanTimeMs", "ms"), ("rewrite", "rewriteTimeMs", "ms"),
                                        ("files removed", "numTargetFilesRemoved", "files")):
                    figures.add(f"last MERGE {what}", float(metrics[key]), unit, way=way, groups=args.groups,
                                changed_groups=count)
    spark.stop()
    base = statistics.median(times["rewrite"][1:])
    print(f"\n{args.groups:,} groups, median of {args.rounds - 1} writes after a warm-up:")
    for way, spent in times.items():
        print(f"  {way:<48} {statistics.median(spent[1:]):6.2f} s ({min(spent[1:]):.2f}-{max(spent[1:]):.2f})"
              f"  {statistics.median(spent[1:]) / base:4.2f}x the rewrite")
        figures.add(way, statistics.median(spent[1:]), "s", baseline=base, ratio=statistics.median(spent[1:]) / base,
                    samples=spent[1:], groups=args.groups)
    figures.write()


if __name__ == "__main__":
    main()
