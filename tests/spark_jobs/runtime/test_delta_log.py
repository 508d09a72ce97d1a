"""The light log reads agree with Delta on real tables written by Spark."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from spark_jobs.runtime.delta_log import (
    ONE_TASK_BYTES,
    appended_files,
    changed_rows,
    newest_commit,
    read_files,
    read_version,
    table_bytes,
    version_files,
)

pytestmark = [pytest.mark.integration]


def _rows(frame: DataFrame) -> list[tuple]:
    return sorted(tuple(r) for r in frame.collect())


def test_a_version_read_from_its_checksum_equals_delta_time_travel(
    spark: SparkSession, table_path: Callable[[str], str]
) -> None:
    path = table_path("light_reads")
    frame = lambda rows: spark.createDataFrame(rows, "k BIGINT, v STRING")  # noqa: E731
    frame([(1, "a"), (2, "b")]).write.format("delta").save(path)
    frame([(3, "c")]).write.format("delta").mode("append").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k = 1")
    frame([(9, "z")]).write.format("delta").mode("overwrite").option("userMetadata", '{"barrier": 7}').save(path)
    for version in range(4):
        delta = spark.read.format("delta").option("versionAsOf", version).load(path)
        assert version_files(spark, path, version) is not None  # the fast path is the one tested
        assert _rows(read_version(spark, path, version)) == _rows(delta), version
    assert newest_commit(spark, path) == (3, {"barrier": 7})
    assert table_bytes(spark, path) > 0


def test_versions_the_checksum_cannot_describe_are_read_by_delta(
    spark: SparkSession, table_path: Callable[[str], str]
) -> None:
    path = table_path("partitioned")
    spark.createDataFrame([(1, "a"), (2, "b")], "k BIGINT, p STRING").write.format("delta").partitionBy("p").save(path)
    assert version_files(spark, path, 0) is None  # partition values live in the log, not the files
    assert _rows(read_version(spark, path, 0)) == [(1, "a"), (2, "b")]

    path = table_path("deletion_vectors")
    spark.createDataFrame([(1, "a"), (2, "b")], "k BIGINT, p STRING").coalesce(1).write.format("delta") \
        .option("delta.enableDeletionVectors", "true").save(path)  # one file: a DELETE marks a row of it
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k = 1")
    assert version_files(spark, path, 1) is None  # a file's deleted rows are in its deletion vector
    assert _rows(read_version(spark, path, 1)) == [(2, "b")]

    path = table_path("mapped")
    spark.createDataFrame([(1, "a")], "k BIGINT, p STRING").write.format("delta") \
        .option("delta.columnMapping.mode", "name").option("delta.enableChangeDataFeed", "false").save(path)
    assert version_files(spark, path, 0) is None  # the files' columns have other (physical) names
    assert _rows(read_version(spark, path, 0)) == [(1, "a")]

    path = table_path("checksums")
    for rows in ([(1, "a")], [(2, "b")], [(3, "c")]):
        spark.createDataFrame(rows, "k BIGINT, p STRING").write.format("delta").mode("append").save(path)
    log = Path(path) / "_delta_log"
    (log / f"{0:020d}.crc").unlink()  # missing
    (log / f"{1:020d}.crc").write_text("not json")  # unreadable to the local file system, whose own checksum fails
    (log / f"{2:020d}.crc").write_text("not json")  # read, and not JSON
    (log / f".{2:020d}.crc.crc").unlink()
    for version, rows in enumerate([[(1, "a")], [(1, "a"), (2, "b")], [(1, "a"), (2, "b"), (3, "c")]]):
        assert version_files(spark, path, version) is None
        assert _rows(read_version(spark, path, version)) == rows


def test_appended_versions_read_from_their_commits_equal_the_change_data_feed(
    spark: SparkSession, table_path: Callable[[str], str]
) -> None:
    path = table_path("appends")
    frame = lambda rows: spark.createDataFrame(rows, "k BIGINT, v STRING")  # noqa: E731
    frame([(1, "a")]).write.format("delta").option("delta.enableChangeDataFeed", "true").save(path)  # version 0
    for rows in ([(2, "b"), (3, "c")], [(4, "d")]):  # 1, 2
        frame(rows).write.format("delta").mode("append").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k = 2")  # 3
    frame([(5, "e")]).write.format("delta").mode("append").save(path)  # 4

    def feed(old: int, new: int) -> list[tuple]:
        rows = (spark.read.option("readChangeFeed", "true").option("startingVersion", old + 1)
                .option("endingVersion", new).table(f"delta.`{path}`"))
        return _rows(rows.where("_change_type = 'insert'").select("k", "v"))

    for old, new in ((0, 1), (0, 2), (1, 2), (3, 4)):
        found = appended_files(spark, path, old, new)
        assert found is not None, (old, new)
        assert _rows(read_files(spark, *found)) == feed(old, new), (old, new)
    assert appended_files(spark, path, 2, 3) is None  # a DELETE removes files: the feed says what
    assert appended_files(spark, path, 0, 4) is None
    assert appended_files(spark, path, -1, 0) is None  # the table's creation: its schema is new
    assert appended_files(spark, path, 4, 4) is None  # no version


def test_changed_rows_weigh_appends_read_from_their_files_and_other_changes_from_the_feed(
    spark: SparkSession, table_path: Callable[[str], str]
) -> None:
    path = table_path("changes")
    frame = lambda rows: spark.createDataFrame(rows, "k BIGINT, v STRING")  # noqa: E731
    frame([(1, "a")]).write.format("delta").option("delta.enableChangeDataFeed", "true").save(path)  # version 0
    frame([(2, "b"), (3, "c")]).write.format("delta").mode("append").save(path)  # 1
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k = 2")  # 2
    spark.sql(f"UPDATE delta.`{path}` SET v = 'C' WHERE k = 3")  # 3

    def weighted(old: int, new: int) -> list[tuple]:
        changed = changed_rows(spark, path, old, new, "w")
        assert changed.columns == ["k", "v", "w"]  # (no change feed columns)
        return _rows(changed)

    assert weighted(0, 1) == [(2, "b", 1), (3, "c", 1)]  # an append: its files, all +1
    assert weighted(1, 3) == [(2, "b", -1), (3, "C", 1), (3, "c", -1)]  # a delete and an update: the feed
    assert weighted(0, 3) == [(2, "b", -1), (2, "b", 1), (3, "C", 1), (3, "c", -1), (3, "c", 1)]


def test_a_small_read_is_one_partition_so_its_aggregate_needs_no_shuffle(
    spark: SparkSession, table_path: Callable[[str], str]
) -> None:
    path = table_path("small_reads")
    frame = lambda rows: spark.createDataFrame(rows, "k BIGINT, v BIGINT").repartition(2)  # noqa: E731
    frame([(k, k * 10) for k in range(40)]).write.format("delta").save(path)  # version 0: two files
    frame([(k % 5, 1) for k in range(40)]).write.format("delta").mode("append").save(path)  # version 1

    def plan(read: DataFrame) -> str:
        return read.groupBy("k").sum("v")._jdf.queryExecution().executedPlan().toString()

    whole, added = version_files(spark, path, 1), appended_files(spark, path, 0, 1)
    assert whole is not None and added is not None
    assert whole.size is not None and added.size is not None and 0 < added.size < whole.size
    for found in (whole, added):
        small = read_files(spark, *found)
        assert small.rdd.getNumPartitions() == 1
        assert "Exchange" not in plan(small)
        large = read_files(spark, found.paths, found.schema_json, ONE_TASK_BYTES + 1)  # (as if it were large)
        assert "Exchange" in plan(large)  # Spark's own split and shuffle
        assert _rows(small) == _rows(large)
    assert _rows(read_version(spark, path, 1)) == _rows(spark.read.format("delta").load(path))
