"""Changed keys as static filters: a read or a MERGE of them opens only the files that may hold them."""

from __future__ import annotations

import random
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.runtime.commits import merge_by_key
from spark_jobs.runtime.pruning import few_keys, within


def files_read(frame: DataFrame) -> int:
    """How many files the frame's scan opened, from the executed plan's own metric."""
    frame.collect()
    plan = frame._jdf.queryExecution().executedPlan()
    found = plan.collectLeaves()
    total = 0
    for i in range(found.size()):
        metrics = found.apply(i).metrics()
        if metrics.contains("numFiles"):
            total += int(metrics.apply("numFiles").value())
    return total


def write_in_key_order(spark: SparkSession, path: str, rows: int, per_file: int) -> None:
    """A table whose files each hold a run of keys, as a stream writes them barrier by barrier."""
    (spark.range(rows).select(F.col("id").alias("k"), (F.col("id") % 7).alias("v")).repartition(1)
     .write.format("delta").option("maxRecordsPerFile", per_file).save(path))


def test_few_changed_keys_open_only_the_files_that_may_hold_them(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_in_key_order(spark, path, 10_000, 1_000)  # 10 files
    table = spark.read.format("delta").load(path)
    changed = spark.createDataFrame([(4_321,), (4_500,), (4_999,)], "k BIGINT")
    found = few_keys(changed)
    assert found is not None
    local, rows = found
    narrowed = table.where(within(rows, [("k", "k")])).join(local, "k", "left_semi")
    assert files_read(narrowed) == 1 and files_read(table.join(local, "k", "left_semi")) == 10
    assert sorted(r.k for r in narrowed.collect()) == [4_321, 4_500, 4_999]
    assert few_keys(spark.range(20).withColumnRenamed("id", "k"), limit=10) is None  # too many: joined as data


def test_a_merge_with_the_changed_keys_range_opens_only_their_files(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_in_key_order(spark, str(path), 10_000, 1_000)
    log = spark.read.json(str(path / "_delta_log" / "00000000000000000000.json")).where("add IS NOT NULL")
    for add in log.select("add.path", F.get_json_object("add.stats", "$.maxValues.k").cast("long").alias("top")).collect():
        if add.top < 9_000:
            (path / add.path).unlink()  # a MERGE that opened this file would fail
    changes = spark.createDataFrame([(9_990, 100), (10_500, 101)], "k BIGINT, v BIGINT")  # an update, an insert
    merge_by_key(spark, str(path), changes, ["k"], ["k", "v"], target=within(changes.collect(), [("t.k", "k")]))
    metrics = DeltaTable.forPath(spark, str(path)).history(1).select("operationMetrics").first()[0]
    assert metrics["numTargetRowsUpdated"] == "1" and metrics["numTargetRowsInserted"] == "1"
    newest = spark.read.format("delta").load(str(path)).where("k >= 9000")
    assert newest.count() == 1_001 and newest.where("k IN (9990, 10500)").agg(F.sum("v")).first()[0] == 201


def test_the_filter_keeps_every_row_of_a_changed_key_whatever_its_type(spark: SparkSession) -> None:
    """NULLs, strings, decimals, dates, timestamps, floats (no range: NaN) and a key of two columns."""
    chance = random.Random(7)
    values = {
        "s": [None, "", "a", "ab", "b", "é", "zz"],
        "d": [None, Decimal("-1.50"), Decimal("0.00"), Decimal("2.25")],
        "day": [None, date(2024, 2, 29), date(1999, 12, 31)],
        "ts": [None, datetime(2026, 1, 1, 0, 0, 1), datetime(2026, 3, 29, 2, 30)],
        "f": [None, float("nan"), -0.0, 1.5],
    }
    schema = "s STRING, d DECIMAL(10,2), day DATE, ts TIMESTAMP, f DOUBLE"
    rows = [tuple(chance.choice(vs) for vs in values.values()) for _ in range(300)]
    frame = spark.createDataFrame(rows, schema)
    for columns in (["s"], ["d"], ["day"], ["ts"], ["f"], ["s", "day"]):
        keys = frame.select(*columns).distinct()
        picked = keys.sample(fraction=0.3, seed=1).collect() or keys.limit(1).collect()
        wanted = spark.createDataFrame(picked, keys.schema)
        on = [frame[c].eqNullSafe(wanted[c]) for c in columns]
        exact = frame.join(wanted, on[0] if len(on) == 1 else on[0] & on[1], "left_semi")
        kept = frame.where(within(picked, [(c, c) for c in columns]))
        assert exact.exceptAll(kept).count() == 0, columns  # nothing a changed key holds is filtered out
        assert kept.count() < frame.count() or columns == ["f"], columns  # and it does filter
