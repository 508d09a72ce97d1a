"""Failure isolation: one job's storage breaks; the other jobs keep committing barriers, and once
the storage is back the supervisor's restart catches the failed job up."""

from __future__ import annotations

import dataclasses
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from spark_jobs.ops.jobs import register_pipeline
from spark_jobs.planning.pipeline import parse_pipeline
from tests.support.barriers import at, wait_for_barrier
from tests.support.supervising import KeyedRecords, Recorder, supervised

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PIPELINE = """
CREATE TABLE events (k BIGINT, v BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE sums AS SELECT k, SUM(v) AS total FROM events GROUP BY k;
CREATE TABLE counts AS SELECT k, COUNT(*) AS n FROM events GROUP BY k;
"""


def test_a_failing_job_does_not_stop_the_others_and_catches_up_after_restart(
    spark: SparkSession, make_worker: Callable, coordinator_env: dict[str, str], make_topic: Callable,
    kafka_bootstrap: str, tmp_path: Path,
) -> None:
    topic = make_topic(partitions=1)
    make_worker()
    settings = dataclasses.replace(Settings.from_env(coordinator_env), warehouse=str(tmp_path / "wh"), home=tmp_path / "home")
    pipeline = parse_pipeline(PIPELINE.format(topic=topic))
    register_pipeline(settings, pipeline)
    reports: list[str] = []
    hooks = Recorder()
    records = KeyedRecords(kafka_bootstrap, topic)
    send, sent = records.send, records.sent
    log = Path(settings.table_location("counts")) / "_delta_log"
    with supervised(spark, pipeline, settings, report=reports.append, max_backoff=2, hooks=[hooks]) as supervisor:
        wait_for_barrier(settings, ["events", "sums", "counts"], send(30), topic)
        shutil.move(log, log.with_name("_delta_log.away"))  # the storage of `counts` breaks
        log.write_text("not a directory")
        state, b = wait_for_barrier(settings, ["events", "sums"], send(30), topic)
        assert state.latest_exact("counts") < b  # counts is stuck ...
        assert {r["k"]: r["total"] for r in at(spark, settings, "sums", state.exact_points("sums")[b]).collect()} == \
            dict(Counter(sent))  # ... while sums carries on
        assert any("maintain_counts failed" in r for r in reports), reports
        log.unlink()
        shutil.move(log.with_name("_delta_log.away"), log)  # storage is back
        state, b = wait_for_barrier(settings, ["events", "sums", "counts"], send(3), topic)
        assert {r["k"]: r["n"] for r in at(spark, settings, "counts", state.exact_points("counts")[b]).collect()} == \
            dict(Counter(sent))
        assert any("maintain_counts restarted" in r for r in reports), reports
        assert set(supervisor.failures) == {"maintain_counts"}
        assert hooks.of("maintain_counts")[:2] == ["created", "failed"] and hooks.of("maintain_sums") == ["created"]
