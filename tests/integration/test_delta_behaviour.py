"""The Delta features Lockstep stands on, checked with real Spark writing real Delta tables."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from spark_jobs.runtime.commits import barrier_txn

pytestmark = [pytest.mark.integration]


def versions(spark: SparkSession, path: str) -> list[int]:
    return sorted(r["version"] for r in DeltaTable.forPath(spark, path).history().collect())


def test_same_txn_app_id_and_version_makes_the_second_write_a_no_op(
    spark: SparkSession, table_path: Callable[[str], str]
) -> None:
    path = table_path("idempotent")
    batch = spark.createDataFrame([(1, "a"), (2, "b")], "id BIGINT, v STRING")
    for _ in range(2):
        batch.write.format("delta").mode("append").option("txnAppId", "job#g0").option("txnVersion", 1).save(path)
    assert spark.read.format("delta").load(path).count() == 2
    assert versions(spark, path) == [0]

    batch.write.format("delta").mode("append").option("txnAppId", "job#g0").option("txnVersion", 2).save(path)
    assert spark.read.format("delta").load(path).count() == 4
    # A new generation is a new app id: its barrier 1 is not the old generation's barrier 1.
    batch.write.format("delta").mode("append").option("txnAppId", "job#g1").option("txnVersion", 1).save(path)
    assert versions(spark, path) == [0, 1, 2]


def test_merge_under_the_same_session_txn_is_skipped_the_second_time(
    spark: SparkSession, table_path: Callable[[str], str]
) -> None:
    path = table_path("merge")
    spark.createDataFrame([(1, 10), (2, 20)], "id BIGINT, amount BIGINT").write.format("delta").save(path)
    changes = spark.createDataFrame([(2, 5), (3, 7)], "id BIGINT, amount BIGINT")
    table = DeltaTable.forPath(spark, path)
    for _ in range(2):
        with barrier_txn(spark, "job#g0", 7, json.dumps({"barrier": 7})):
            (
                table.alias("t")
                .merge(changes.alias("c"), "t.id = c.id")
                .whenMatchedUpdate(set={"amount": "t.amount + c.amount"})
                .whenNotMatchedInsertAll()
                .execute()
            )
    rows = {r["id"]: r["amount"] for r in spark.read.format("delta").load(path).collect()}
    assert rows == {1: 10, 2: 25, 3: 7}, "the repeated MERGE must not add the change twice"
    assert versions(spark, path) == [0, 1]


def test_change_data_feed_between_versions(spark: SparkSession, table_path: Callable[[str], str]) -> None:
    path = table_path("cdf")
    spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "id BIGINT, v STRING").write.format("delta").option(
        "delta.enableChangeDataFeed", "true"
    ).save(path)  # v0
    table = DeltaTable.forPath(spark, path)
    table.update("id = 2", {"v": "'B'"})  # v1
    table.delete("id = 3")  # v2
    spark.createDataFrame([(4, "d")], "id BIGINT, v STRING").write.format("delta").mode("append").save(path)  # v3

    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 1)
        .option("endingVersion", 3)
        .load(path)
        .collect()
    )
    got = sorted((r["_commit_version"], r["_change_type"], r["id"], r["v"]) for r in changes)
    assert got == [
        (1, "update_postimage", 2, "B"),
        (1, "update_preimage", 2, "b"),
        (2, "delete", 3, "c"),
        (3, "insert", 4, "d"),
    ]


def test_user_metadata_is_read_back_from_history(spark: SparkSession, table_path: Callable[[str], str]) -> None:
    path = table_path("meta")
    meta = {"barrier": 42, "job": "ingest_shopping", "generation": 0}
    spark.range(3).write.format("delta").option("userMetadata", json.dumps(meta)).save(path)
    spark.range(1).write.format("delta").mode("append").save(path)
    history = {r["version"]: r["userMetadata"] for r in DeltaTable.forPath(spark, path).history().collect()}
    assert json.loads(history[0]) == meta
    assert history[1] is None
