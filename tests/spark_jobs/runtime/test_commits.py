"""Barrier commits on real Delta tables: idempotence and recovery from a cut-short creation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
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
