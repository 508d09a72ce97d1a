"""Waiting for barriers and reading tables at their exact points, for pipeline tests."""

from __future__ import annotations

import time
from collections import Counter

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from coordinator.client.state import read_state
from coordinator.domain import MetaState
from coordinator.settings import Settings
from spark_jobs.runtime.delta_log import parse_metadata

# Records {"k", "seq"} (tests.support.supervising.SequencedFeed) and an aggregate over them: the
# drills check that every record is in ``events`` exactly once and that ``per_key`` agrees
SEQUENCED_PIPELINE = """
CREATE TABLE events (k BIGINT, seq BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE per_key AS SELECT k, COUNT(*) AS n, MAX(seq) AS last_seq, SUM(seq) AS total FROM events GROUP BY k;
"""


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
    return spark.read.format("delta").option("versionAsOf", version).load(settings.table_location(table))


def check_each_record_once(spark: SparkSession, settings: Settings, state: MetaState, b: int,
                           expected: Counter[int]) -> None:
    """At barrier ``b`` of a SEQUENCED_PIPELINE: per key, ``events`` holds seq 1..n with no gap
    and no duplicate (n from ``expected``), and ``per_key`` agrees (count n, max n, sum 1+..+n)."""
    rows = at(spark, settings, "events", state.exact_points("events")[b]).collect()
    by_key: dict[int, list[int]] = {}
    for r in rows:
        by_key.setdefault(r["k"], []).append(r["seq"])
    for k, n in expected.items():
        assert sorted(by_key.get(k, [])) == list(range(1, n + 1)), f"key {k}: gap or duplicate"
    assert set(by_key) == set(expected), f"keys nobody sent: {set(by_key) - set(expected)}"
    aggregates = {r["k"]: (r["n"], r["last_seq"], r["total"])
                  for r in at(spark, settings, "per_key", state.exact_points("per_key")[b]).collect()}
    assert aggregates == {k: (n, n, n * (n + 1) // 2) for k, n in expected.items()}


def check_published_versions(spark: SparkSession, settings: Settings, state: MetaState, table: str, upto: int) -> None:
    """Each barrier committed once; every commit up to ``upto`` announced; and each completion's
    version is the one the history says holds its barrier: the newest commit of a barrier <= it."""
    history = DeltaTable.forPath(spark, settings.table_location(table)).history().collect()
    commits = [(parse_metadata(h["userMetadata"]).get("barrier"), h["version"]) for h in history]
    barriers = sorted((b, v) for b, v in commits if b is not None)
    assert len(barriers) == len({b for b, _ in barriers}), f"{table}: a barrier was committed twice"
    published = {c.barrier: c.delta_version for c in state.completions[table].values()}
    assert {b for b, _ in barriers if b <= upto} <= set(published), f"{table}: commits without a completion"
    for barrier, version in published.items():
        holder = max((v for b, v in barriers if b <= barrier), default=0)
        assert version == holder, f"{table}: barrier {barrier} published version {version}; its history says {holder}"
