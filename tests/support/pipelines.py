"""Fixtures for pipeline tests: run a pipeline's jobs against a real worker, Kafka and Delta."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from spark_jobs.ops.jobs import register_pipeline
from spark_jobs.planning.pipeline import parse_pipeline
from tests.support.supervising import Stack, supervised


@pytest.fixture
def make_stack(make_worker: Callable, coordinator_env: dict[str, str], tmp_path: Path) -> Callable[..., Stack]:
    """Factory: start a worker (``make(**env)``: more LOCKSTEP_* settings of the worker's); a Stack
    whose settings use it and this test's warehouse and home."""

    def make(**env: str) -> Stack:
        worker = make_worker(env=env)
        settings = dataclasses.replace(Settings.from_env(coordinator_env), warehouse=str(tmp_path / "wh"),
                                       home=tmp_path / "home", coordinator_url=worker.url)
        return Stack(settings, tmp_path)

    return make


@pytest.fixture
def run_pipeline(
    spark: SparkSession, make_worker: Callable, coordinator_env: dict[str, str], tmp_path: Path
) -> Iterator[Callable[..., Settings]]:
    """Factory: ``run_pipeline(sql, **settings_changes)`` starts a worker, registers the pipeline
    and runs its jobs under a Supervisor, each job its own query, as `lockstep run` does with
    ``LOCKSTEP_FUSE_JOBS=0``; returns the settings they use. A job that fails is restarted, as in
    `lockstep run`: on a busy machine Spark's Python worker for the barrier source may not connect
    back within Spark's fixed 10 s. The jobs stop at the end of the test."""
    with ExitStack() as running:

        def run(sql: str, **changes: Any) -> Settings:
            worker = make_worker()
            settings = dataclasses.replace(Settings.from_env(coordinator_env), warehouse=str(tmp_path / "wh"),
                                           home=tmp_path / "home", coordinator_url=worker.url,
                                           **{"fuse_jobs": False, **changes})
            pipeline = parse_pipeline(sql)
            register_pipeline(settings, pipeline)
            running.enter_context(supervised(spark, pipeline, settings, report=print))
            return settings

        yield run
