from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from spark_jobs.runtime.session import SparkSetupError, jvm_exited_error, spark_jars


def test_missing_jars_explain_how_to_fix(tmp_path: Path) -> None:
    settings = dataclasses.replace(Settings.from_env({}), jars=tmp_path)
    with pytest.raises(SparkSetupError, match="scripts/setup"):
        spark_jars(settings)


@pytest.mark.parametrize(("code", "said"), [
    (52, "exited with code 52 (out of memory: give the driver more, e.g. --conf spark.driver.memory=4g)"),
    (50, "exited with code 50 (a fatal error in one of its threads, above)"),
    (-9, "was killed by signal 9"),
    (1, "exited with code 1 (its last error is above)"),
])
def test_a_driver_jvm_that_exited_is_said_with_what_its_code_means(code: int, said: str) -> None:
    message = str(jvm_exited_error(code))
    assert message.startswith(f"Spark's driver JVM {said}, and every job with it")
    assert message.endswith("running the pipeline again continues each job from its last committed barrier")


@pytest.mark.integration
def test_session_has_delta_small_machine_defaults_and_cached_jars(spark: SparkSession) -> None:
    conf = spark.sparkContext.getConf()
    assert spark.conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert conf.get("spark.master") == "local[2]"
    assert conf.get("spark.ui.enabled") == "false"
    jars = conf.get("spark.jars").split(",")
    assert any("delta-spark_2.13" in j for j in jars)
    assert any("spark-sql-kafka" in j for j in jars)
    assert all(Path(j).is_file() for j in jars), "spark.jars must point at the local cache, never a download"
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    # A Python worker really runs with our interpreter (UDFs, Python data sources need it).
    worker_python = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").executable).first()
    assert worker_python == sys.executable


@pytest.mark.integration
def test_a_python_udf_reads_a_delta_table(spark: SparkSession, tmp_path: Path) -> None:
    """Spark 4.2.0 feeds a UDF from a columnar scan in a message its worker misreads (crash or
    hang; SPARK-58241): the session turns that path off."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    spark.range(50).selectExpr("id", "id % 3 AS g").write.format("delta").save(str(tmp_path / "t"))
    label = F.udf(lambda x: f"#{x}", StringType())
    rows = spark.read.format("delta").load(str(tmp_path / "t")).select("g", label("id").alias("l")).groupBy("g").count()
    assert sorted(tuple(r) for r in rows.collect()) == [(0, 17), (1, 17), (2, 16)]


def test_a_spark_error_is_told_in_one_line_naming_what_the_jvm_said(spark: SparkSession) -> None:
    from py4j.protocol import Py4JJavaError

    from spark_jobs.runtime.session import spark_error

    with pytest.raises(Py4JJavaError) as raised:
        spark.sparkContext._jvm.java.lang.Class.forName("no.such.Class")  # type: ignore[union-attr]
    assert str(raised.value).startswith("An error occurred while calling")  # what Py4J says first
    assert spark_error(raised.value) == "java.lang.ClassNotFoundException: no.such.Class"
    with pytest.raises(Exception) as analysis:
        spark.sql("SELECT no_such_column FROM range(1)")
    message = spark_error(analysis.value)
    assert "no_such_column" in message and "\n" not in message
