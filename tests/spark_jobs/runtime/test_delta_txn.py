"""A barrier's commit without rebuilding the table's state, on real Delta tables: the same commit
Delta's writer makes (rows, txn mark, metadata), once per barrier; a mark never goes back; and
Delta's writer takes over, saying why once, where the checksum does not hold what it needs."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from spark_jobs.runtime.commits import DeltaSink
from spark_jobs.runtime.delta_log import delta_log
from spark_jobs.runtime.delta_txn import ALREADY, Fallback, Mark, commit_directly
from spark_jobs.runtime.session import session_conf

pytestmark = [pytest.mark.integration]
DDL = "k BIGINT, v BIGINT"


def frame(spark: SparkSession, rows: list[tuple[int, int]]) -> DataFrame:
    return spark.createDataFrame(rows, DDL)


def marks(spark: SparkSession, path: str) -> dict[str, int]:
    """The table's txn marks as Delta's own state says (a full reconstruction)."""
    log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)  # type: ignore[union-attr]
    none = spark._jvm.scala.Option.empty()  # type: ignore[union-attr]
    transactions = log.update(False, none, none).transactions()
    return {key: transactions.apply(key) for key in spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(  # type: ignore[union-attr]
        transactions.keys())}


def test_appends_and_rewrites_commit_directly_as_deltas_writer_would_and_once(
    spark: SparkSession, table_path: Callable[[str], str],
) -> None:
    path = table_path("direct")
    sink = DeltaSink(spark, path, "job", DDL, name="direct")
    appended = sink.commit(1, 0, lambda: sink.append(frame(spark, [(1, 10), (2, 20)])))
    assert sink._direct == appended and sink.written
    rewritten = sink.commit(2, 0, lambda: sink.overwrite(frame(spark, [(3, 30)]), {"maxRecordsPerFile": "10"}))
    assert sink._direct == rewritten == appended + 1
    at = lambda version: sorted(tuple(r) for r in spark.read.format("delta").option("versionAsOf", version).load(path).collect())  # noqa: E731
    assert (at(appended), at(rewritten)) == ([(1, 10), (2, 20)], [(3, 30)])
    history = {r["version"]: r for r in DeltaTable.forPath(spark, path).history().collect()}
    assert [history[v]["operation"] for v in (appended, rewritten)] == ["WRITE", "WRITE"]
    assert history[rewritten]["operationParameters"]["mode"] == "Overwrite"
    assert json.loads(history[rewritten]["userMetadata"]) == {"barrier": 2, "job": "job", "generation": 0}
    assert marks(spark, path) == {"job#g0": 2}  # Delta's own state holds the mark the direct commit set

    # the same barrier again, or an older one (a zombie of the same app): no commit, the mark stays
    assert sink.commit(2, 0, lambda: sink.append(frame(spark, [(9, 9)]))) == rewritten
    mark = Mark("job#g0", 1, "{}")
    assert commit_directly(spark, delta_log(spark, path), frame(spark, [(9, 9)]), "append", mark) == ALREADY
    assert marks(spark, path) == {"job#g0": 2} and DeltaTable.forPath(spark, path).history(1).first()["version"] == rewritten
    restarted = DeltaSink(spark, path, "job", DDL)  # a restart finds each barrier's version in the history
    assert restarted.versions == {(0, 1): appended, (0, 2): rewritten}


def test_deltas_writer_takes_over_where_the_checksum_cannot_answer_and_says_so_once(
    spark: SparkSession, table_path: Callable[[str], str], caplog: pytest.LogCaptureFixture,
) -> None:
    path = table_path("fallback")
    sink = DeltaSink(spark, path, "job", DDL, name="fallback")
    other = spark.createDataFrame([(1, "x")], "k BIGINT, w STRING")
    other_columns = commit_directly(spark, delta_log(spark, path), other, "append", Mark("job#g0", 1, "{}"))
    assert isinstance(other_columns, Fallback)
    # a table whose checksum keeps no marks (Delta drops them past its limit of apps, 100 by default)
    with session_conf(spark, {"spark.databricks.delta.setTransactionsInCrc.maxAllowed": "1"}):
        for generation in range(3):
            sink.commit(generation + 1, generation, lambda g=generation: frame(spark, [(g, 0)]).write.format("delta")
                        .mode("append").save(path))
    with caplog.at_level(logging.WARNING, logger="spark_jobs.runtime.commits"):
        version = sink.commit(4, 3, lambda: sink.append(frame(spark, [(4, 0)])))
        assert sink._direct is None and sink.versions[(3, 4)] == version  # Delta's writer did it
        sink.commit(5, 3, lambda: sink.append(frame(spark, [(5, 0)])))  # (again, or direct once Delta kept the marks)
    said = [r.getMessage() for r in caplog.records if "through Delta's writer" in r.getMessage()]
    assert len(said) == 1 and "keeps no txn marks" in said[0], said
    assert spark.read.format("delta").load(path).count() == 5
    assert marks(spark, path)["job#g3"] == 5
