"""Scheduled vacuum while the jobs run: old files go by themselves (dead letters' too), every
readable point stays."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from lockstep_reads import open_snapshot
from spark_jobs.ops.upkeep import TableUpkeep
from tests.support import wait_until
from tests.support.barriers import wait_for_barrier
from tests.support.supervising import KeyedRecords

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PIPELINE = """
CREATE TABLE events (k BIGINT, v BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE sums AS SELECT k, SUM(v) AS total FROM events GROUP BY k;
"""


def test_scheduled_vacuum_deletes_old_files_while_the_jobs_commit(
    spark: SparkSession, run_pipeline: Callable[[str], Settings], make_topic: Callable, kafka_bootstrap: str,
    coordinator_env: dict[str, str],
) -> None:
    coordinator_env["LOCKSTEP_COMPACT_EVERY"] = "2"  # dead letters too: compacted files become old files
    topic = make_topic(partitions=1)
    settings = run_pipeline(PIPELINE.format(topic=topic))
    settings = dataclasses.replace(settings, retain_barriers=1)  # keep little history: files go soon
    records = KeyedRecords(kafka_bootstrap, topic, keys=4, value=lambda i: i)
    messages: list[str] = []
    with TableUpkeep(spark, settings, ["events", "sums"], messages.append, every_s=2.0):
        for i in range(6):  # each barrier with new rows MERGEs into sums and replaces its files
            records.producer.produce(topic, f"not json {i}".encode())  # and adds a dead letter
            wait_for_barrier(settings, ["events", "sums"], records.send(10), topic)
        wait_until(lambda: any("of events__dlq" in m for m in messages) and any("of sums" in m for m in messages),
                   "scheduled rounds deleting old files of sums and of the dead letters", timeout=120)
        _, barrier = wait_for_barrier(settings, ["events", "sums"], records.send(10), topic)
    assert not any("failed" in m for m in messages), messages
    with open_snapshot(["sums"], settings=settings, spark=spark) as snap:  # the newest point reads every record once
        got = {r["k"]: r["total"] for r in snap.table("sums").collect()}
    expected: dict[int, int] = {}
    for i, k in enumerate(records.sent):
        expected[k] = expected.get(k, 0) + i
    assert snap.barrier is not None and snap.barrier >= barrier and got == expected
    dead = spark.read.format("delta").load(settings.table_location("events__dlq"))
    assert sorted(r["raw_value"].decode() for r in dead.collect()) == [f"not json {i}" for i in range(6)]
