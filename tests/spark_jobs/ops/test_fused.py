"""Fused groups: a root job's query drives the jobs that read only its tables; their tables are
what their own queries would have made, and a member that fails runs as its own query."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import pytest
from pyspark.sql import SparkSession

from coordinator.domain.work import BarrierWork
from spark_jobs.ops.fused import FusedJob
from spark_jobs.ops.jobs import register_pipeline
from spark_jobs.planning.pipeline import parse_pipeline
from spark_jobs.runtime.ivm import TableMaintainer
from tests.support import wait_until
from tests.support.barriers import at, wait_for_barrier
from tests.support.supervising import KeyedRecords, Stack, supervised

pytestmark = [pytest.mark.integration]

PIPELINE = """
CREATE TABLE events (k BIGINT, v BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE sums AS SELECT k, SUM(v) AS total FROM events GROUP BY k;
CREATE TABLE big_sums AS SELECT k, total FROM sums WHERE total > 100;
"""


def streams(spark: SparkSession, jobs: set[str]) -> list[str]:
    return sorted(q.name for q in spark.streams.active if q.name in jobs)


def test_members_run_on_the_leaders_commits_and_one_that_fails_runs_as_its_own_query(
    spark: SparkSession, make_stack: Callable[[], Stack], make_topic: Callable, kafka_bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = make_topic(partitions=1)
    stack = make_stack()
    settings = stack.settings
    pipeline = parse_pipeline(PIPELINE.format(topic=topic))
    register_pipeline(settings, pipeline)
    records = KeyedRecords(kafka_bootstrap, topic, value=lambda i: i)
    jobs = {j.job_id for j in pipeline.jobs}
    fail: list[int] = []  # set: maintain_sums raises at its next barrier, once
    process = TableMaintainer.process

    def failing_once(self: TableMaintainer, work: BarrierWork) -> None:
        if self.job_id == "maintain_sums" and fail == [0]:
            fail.append(work.barrier)
            raise RuntimeError("a member's barrier failed")
        process(self, work)

    monkeypatch.setattr(TableMaintainer, "process", failing_once)
    reports: list[str] = []
    with supervised(spark, pipeline, settings, report=reports.append) as supervisor:
        assert supervisor.fused == {"maintain_sums": "ingest_events", "maintain_big_sums": "ingest_events"}
        assert "fused group of ingest_events: maintain_sums, maintain_big_sums run on its commits " \
               "(no query of their own)" in reports
        assert all(isinstance(supervisor.queries[j], FusedJob) for j in supervisor.fused)
        assert streams(spark, jobs) == ["ingest_events"]  # one streaming query for the group
        wait_for_barrier(settings, ["events", "sums", "big_sums"], records.send(30), topic)

        fail.append(0)
        wait_until(lambda: len(fail) == 2, "maintain_sums fails once")
        state, b = wait_for_barrier(settings, ["events", "sums", "big_sums"], records.send(30), topic)
        assert supervisor.fused == {"maintain_big_sums": "ingest_events"} and supervisor.failures == {"maintain_sums": 1}
        assert streams(spark, jobs) == ["ingest_events", "maintain_sums"]
    assert any(r.startswith("job maintain_sums leaves its fused group") for r in reports), reports
    assert any(r.startswith("job maintain_sums restarted (attempt 2)") for r in reports), reports

    totals = Counter[int]()
    for i, k in enumerate(records.sent):
        totals[k] += i
    got = {r["k"]: r["total"] for r in at(spark, settings, "sums", state.exact_points("sums")[b]).collect()}
    assert got == dict(totals)
    big = {r["k"]: r["total"] for r in at(spark, settings, "big_sums", state.exact_points("big_sums")[b]).collect()}
    assert big == {k: t for k, t in totals.items() if t > 100}


def test_without_fusion_every_job_is_its_own_query(
    spark: SparkSession, make_stack: Callable[[], Stack], make_topic: Callable, kafka_bootstrap: str,
) -> None:
    topic = make_topic(partitions=1)
    stack = make_stack()
    settings = dataclasses.replace(stack.settings, fuse_jobs=False)
    pipeline = parse_pipeline(PIPELINE.format(topic=topic))
    register_pipeline(settings, pipeline)
    records = KeyedRecords(kafka_bootstrap, topic)
    with supervised(spark, pipeline, settings) as supervisor:
        assert supervisor.fused == {}
        assert streams(spark, {j.job_id for j in pipeline.jobs}) == ["ingest_events", "maintain_big_sums",
                                                                     "maintain_sums"]
        wait_for_barrier(settings, ["events", "sums", "big_sums"], records.send(10), topic)
