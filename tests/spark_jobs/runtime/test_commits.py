"""Barrier commits on real Delta tables: idempotence, recovery from a cut-short creation, and the
upkeep between barriers (compaction, log retention)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from spark_jobs.runtime.commits import CHECKPOINT_EVERY, DeltaSink, Write
from spark_jobs.runtime.session import RETENTION_DEFAULTS, session_conf

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


def test_a_write_handed_as_a_value_appends_overwrites_or_merges_once_per_barrier(
    spark: SparkSession, table_path: Callable[[str], str]
) -> None:
    path = table_path("writes")
    sink = DeltaSink(spark, path, "job", "k BIGINT, v STRING")
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    rows = lambda *r: spark.createDataFrame(list(r), "k BIGINT, v STRING")  # noqa: E731
    read = lambda version: {tuple(r) for r in spark.read.format("delta").option("versionAsOf", version)  # noqa: E731
                            .load(path).collect()}
    first = sink.commit(1, 0, Write("append", rows((1, "a"), (2, "b"), (None, "n"))))
    assert sink.commit(1, 0, Write("append", rows((9, "again")))) == first  # the same barrier: no second write
    changes = rows((2, "B"), (None, "N"), (3, "c"), (1, None)).selectExpr("*", "k <=> 1 AS gone")
    merged = sink.commit(2, 0, Write("merge", changes, key=["k"], columns=["k", "v"], delete_flag="gone"))
    assert read(merged) == {(2, "B"), (3, "c"), (None, "N")}  # a NULL key matched, key 1 deleted
    whole = sink.commit(3, 0, Write("overwrite", rows((7, "x"), (8, "y")).repartition(3, "k"),
                                    {"maxRecordsPerFile": "1"}, one_task=True))
    assert read(whole) == {(7, "x"), (8, "y")} and read(first) == {(1, "a"), (2, "b"), (None, "n")}
    assert len(spark.read.format("delta").load(path).inputFiles()) == 2  # the writer's option: a row a file
    assert spark.conf.get("spark.sql.shuffle.partitions") == partitions  # one task only for that write
    assert sink.versions == {(0, 1): first, (0, 2): merged, (0, 3): whole}


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


def test_old_log_entries_go_at_a_checkpoint_and_every_kept_exact_point_still_reads(
    spark: SparkSession, table_path: Callable[[str], str]
) -> None:
    path = table_path("log_retention")
    log = Path(path) / "_delta_log"
    write = lambda b: lambda: spark.createDataFrame([(b,)], "b BIGINT").write.format("delta").mode("append").save(path)  # noqa: E731
    DeltaSink(spark, path, "job", "b BIGINT").commit(1, 0, write(1))  # created with the session's retention
    with session_conf(spark, dict.fromkeys(RETENTION_DEFAULTS, "interval 1 hours")):
        sink = DeltaSink(spark, path, "job", "b BIGINT")  # an existing table gets the retention asked now
        sink._finish_upkeep()
        properties = DeltaTable.forPath(spark, path).detail().first()["properties"]
        assert properties["delta.logRetentionDuration"] == "interval 1 hours"
        for barrier in range(2, 2 + CHECKPOINT_EVERY):  # the sink checkpoints after its 10th commit
            sink.commit(barrier, 0, write(barrier))
        sink._finish_upkeep()
        aged = time.time() - 3 * 86_400  # everything so far as if written three days ago
        for i, file in enumerate(sorted(log.glob("0*"))):
            os.utime(file, (aged + i, aged + i))
        for barrier in range(2 + CHECKPOINT_EVERY, 2 + 2 * CHECKPOINT_EVERY):  # the next checkpoint cleans up
            sink.commit(barrier, 0, write(barrier))
        sink._finish_upkeep()
    commits = sorted(int(p.stem) for p in log.glob("*.json"))
    checkpoints = sorted(int(p.name.split(".")[0]) for p in log.glob("*.checkpoint.parquet"))
    assert commits[0] == checkpoints[0] > 0, (commits, checkpoints)  # what is older than the aged checkpoint went
    for (_, barrier), version in sink.versions.items():
        if version >= commits[0]:  # what is left reads as it did
            rows = spark.read.format("delta").option("versionAsOf", version).load(path).collect()
            assert sorted(r["b"] for r in rows) == list(range(1, barrier + 1))
    restarted = DeltaSink(spark, path, "job", "b BIGINT")  # a restart finds the newest barriers' versions
    assert max(restarted.versions) == max(sink.versions)
