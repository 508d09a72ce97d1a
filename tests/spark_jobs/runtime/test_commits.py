"""Barrier commits on real Delta tables: idempotence and recovery from a cut-short creation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from spark_jobs.runtime.commits import DeltaSink

pytestmark = [pytest.mark.integration]


def test_a_creation_cut_short_by_a_kill_is_redone(spark: SparkSession, table_path: Callable[[str], str]) -> None:
    path = table_path("cut_short")
    (Path(path) / "_delta_log").mkdir(parents=True)  # what a kill during createIfNotExists leaves
    sink = DeltaSink(spark, path, "job", "k BIGINT")
    write = lambda: spark.createDataFrame([(1,)], "k BIGINT").write.format("delta").mode("append").save(path)  # noqa: E731
    version = sink.commit(1, 0, write)
    assert sink.commit(1, 0, write) == version  # the same barrier again: no second write
    again = DeltaSink(spark, path, "job", "k BIGINT")  # a restart finds the commit in the history
    assert again.versions == {(0, 1): version}
    assert spark.read.format("delta").load(path).count() == 1


def test_compaction_between_barriers_changes_no_exact_point(spark: SparkSession, table_path: Callable[[str], str]) -> None:
    path = table_path("compacted")
    sink = DeltaSink(spark, path, "job", "k BIGINT, b BIGINT", compact_every=3)
    seen: dict[int, list[tuple[int, int]]] = {}
    for barrier in range(1, 8):
        rows = [(k, barrier) for k in range(barrier * 10, barrier * 10 + 5)]
        version = sink.commit(barrier, 0, lambda rows=rows: spark.createDataFrame(rows, "k BIGINT, b BIGINT")
                              .repartition(2).write.format("delta").mode("append").save(path))
        seen[version] = sorted(tuple(r) for r in spark.read.format("delta").option("versionAsOf", version).load(path).collect())
    sink._finish_upkeep()
    history = DeltaTable.forPath(spark, path).history().select("version", "operation").collect()
    assert sum(r["operation"] == "OPTIMIZE" for r in history) == 2  # after the 3rd and the 6th commit
    for version, rows in seen.items():  # every barrier's version reads what it read when committed
        assert sorted(tuple(r) for r in spark.read.format("delta").option("versionAsOf", version).load(path).collect()) == rows
    restarted = DeltaSink(spark, path, "job", "k BIGINT, b BIGINT")  # barrier -> version survives in the history
    assert restarted.versions == sink.versions and sorted(restarted.versions.values()) == sorted(seen)
    changes = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", min(seen))
               .load(path).where("_change_type = 'insert'").count())
    assert changes == 7 * 5  # each barrier's rows once: compaction adds no change rows
    files_now = len(spark.read.format("delta").load(path).inputFiles())
    assert files_now < 7 * 2  # 2 files a barrier without compaction
