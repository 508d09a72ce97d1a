"""Waiting for barriers and reading tables at their exact points, for pipeline tests."""

from __future__ import annotations

import time

from pyspark.sql import DataFrame, SparkSession

from coordinator.client.state import read_state
from coordinator.domain import MetaState
from coordinator.settings import Settings


def wait_for_barrier(
    settings: Settings, tables: list[str], covers: dict[int, int], topic: str, timeout: float = 120
) -> tuple[MetaState, int]:
    """Newest common exact point whose cut covers ``covers`` (partition -> end offset)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = read_state(settings)
        b = state.common_barrier(tables)
        if b is not None:
            cut = {c.partition: c.offset for c in state.barriers[b].cut if c.topic == topic}
            if all(cut.get(p, 0) >= end for p, end in covers.items()):
                return state, b
        time.sleep(0.5)
    raise AssertionError(f"no common exact point covering {covers} within {timeout}s")


def at(spark: SparkSession, settings: Settings, table: str, version: int) -> DataFrame:
    return spark.read.format("delta").option("versionAsOf", version).load(str(settings.warehouse / table))
