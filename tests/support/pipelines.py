"""Fixtures for pipeline tests: run a pipeline's jobs against a real worker, Kafka and Delta."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from spark_jobs.ops.jobs import JobRun, register_pipeline, start_job
from spark_jobs.ops.renewals import Renewals
from spark_jobs.planning.pipeline import parse_pipeline
from tests.support.supervising import Stack


@pytest.fixture
def make_stack(make_worker: Callable, coordinator_env: dict[str, str], tmp_path: Path) -> Callable[[], Stack]:
    """Factory: start a worker; a Stack whose settings use it and this test's warehouse and home."""

    def make() -> Stack:
        worker = make_worker()
        settings = dataclasses.replace(Settings.from_env(coordinator_env), warehouse=str(tmp_path / "wh"),
                                       home=tmp_path / "home", coordinator_url=worker.url)
        return Stack(settings, tmp_path)

    return make


@pytest.fixture
def run_pipeline(
    spark: SparkSession, make_worker: Callable, coordinator_env: dict[str, str], tmp_path: Path
) -> Iterator[Callable[..., Settings]]:
    """Factory: ``run_pipeline(sql, **settings_changes)`` starts a worker, registers the pipeline
    and runs its jobs; returns the settings they use. The jobs stop at the end of the test."""
    runs: list[JobRun] = []
    renewals: list[Renewals] = []

    def run(sql: str, **changes: Any) -> Settings:
        worker = make_worker()
        settings = dataclasses.replace(Settings.from_env(coordinator_env), warehouse=str(tmp_path / "wh"), home=tmp_path / "home",
                                       coordinator_url=worker.url, **changes)
        pipeline = parse_pipeline(sql)
        register_pipeline(settings, pipeline)
        # as `lockstep run` does: a CTAS table whose first commit is slow is not taken for abandoned
        renewals.append(Renewals(settings, [j.job_id for j in pipeline.jobs]).start())
        runs.extend(start_job(spark, pipeline, job, settings) for job in pipeline.jobs)
        return settings

    yield run
    for job in runs:
        job.query.stop()
        job.processor.close()
    for renewal in renewals:
        renewal.close()
