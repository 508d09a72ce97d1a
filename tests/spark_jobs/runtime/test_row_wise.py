"""What Spark's analyzed plan of a function's result says: whether it is each input row taken
alone (row-wise), whether it keeps its input's key, and which input rows it raises on."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from spark_jobs.runtime.row_wise import failing_rows, key_problem, row_wise_problem

pytestmark = pytest.mark.integration


@pytest.fixture
def orders(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([(i, i % 3, i * 10) for i in range(12)], "oid BIGINT, uid BIGINT, amount BIGINT")


@pytest.mark.parametrize(("function", "problem"), [
    (lambda o: o.where("amount > 20").select("oid", (F.col("amount") * 2).alias("twice")), None),
    (lambda o: o.select("oid", F.explode(F.array("uid", "amount")).alias("x")), None),
    (lambda o: o.groupBy("uid").count(), "needs other rows than each input row alone (Aggregate)"),
    (lambda o: o.join(o.select("uid"), "uid"), "needs other rows than each input row alone (Join)"),
    (lambda o: o.orderBy("amount").limit(3), "needs other rows"),
])
def test_a_function_is_row_wise_when_its_plan_only_projects_filters_and_generates(
        orders: DataFrame, function: Callable[[DataFrame], DataFrame], problem: str | None) -> None:
    found = row_wise_problem(function(orders))
    assert found == problem if problem is None else problem in (found or "")


@pytest.mark.parametrize(("function", "problem"), [
    (lambda o: o.where("amount > 20").select(F.col("OID"), (F.col("amount") * 2).alias("twice")), None),
    (lambda o: o.withColumnRenamed("amount", "a").alias("x").select("x.oid", "a"), None),
    (lambda o: o.select("oid", F.explode(F.array("uid", "amount")).alias("x")), "several rows (a generator"),
    (lambda o: o.select((F.col("oid") + 0).alias("oid")), "does not keep orders's key (oid) as it is"),
    (lambda o: o.select("uid", "amount"), "does not keep orders's key (oid)"),
])
def test_a_function_keeps_its_inputs_key_when_it_passes_the_key_columns_through_unchanged(
        orders: DataFrame, function: Callable[[DataFrame], DataFrame], problem: str | None) -> None:
    found = key_problem(function(orders), "orders", ["oid"])
    assert found == problem if problem is None else problem in (found or "")


def test_the_rows_a_udf_raises_on_are_found_with_the_error_and_the_rest_kept(orders: DataFrame) -> None:
    @F.udf(LongType())
    def tenth(amount: int) -> int:
        if amount in (30, 80):
            raise ValueError(f"no tenth of {amount}")
        return amount // 10

    good, letters = failing_rows(orders, lambda rows: rows.select("oid", tenth("amount").alias("t")))
    assert sorted(letters) == [('{"oid": 3, "uid": 0, "amount": 30}', "ValueError: no tenth of 30"),
                               ('{"oid": 8, "uid": 2, "amount": 80}', "ValueError: no tenth of 80")]
    assert sorted(r["oid"] for r in good.collect()) == [i for i in range(12) if i not in (3, 8)]
