"""Scheduled vacuum while the jobs run: old files go by themselves, every readable point stays."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from spark_jobs.api.reads import open_snapshot
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
) -> None:
    topic = make_topic(partitions=1)
    settings = run_pipeline(PIPELINE.format(topic=topic))
    settings = dataclasses.replace(settings, retain_barriers=1)  # keep little history: files go soon
    records = KeyedRecords(kafka_bootstrap, topic, keys=4, value=lambda i: i)
    messages: list[str] = []
    with TableUpkeep(spark, settings, ["events", "sums"], messages.append, every_s=2.0) as upkeep:
        for _ in range(6):  # each barrier with new rows MERGEs into sums and replaces its files
            wait_for_barrier(settings, ["events", "sums"], records.send(10), topic)
        wait_until(lambda: upkeep.deleted > 0, "a scheduled round deleting old files", timeout=120)
        _, barrier = wait_for_barrier(settings, ["events", "sums"], records.send(10), topic)
    assert any("scheduled vacuum deleted" in m and "of sums" in m for m in messages), messages
    assert not any("failed" in m for m in messages), messages
    with open_snapshot(spark, ["sums"], settings=settings) as snap:  # the newest point reads every record once
        got = {r["k"]: r["total"] for r in snap.table("sums").collect()}
    expected: dict[int, int] = {}
    for i, k in enumerate(records.sent):
        expected[k] = expected.get(k, 0) + i
    assert snap.barrier is not None and snap.barrier >= barrier and got == expected
