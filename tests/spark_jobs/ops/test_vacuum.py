"""Lease-aware vacuum: with zero retention it removes the files nobody needs, while a
repeatable-read snapshot keeps reading its versions and the running jobs keep committing."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from coordinator.client.state import read_state
from coordinator.domain.errors import UnknownTables
from coordinator.settings import Settings
from lockstep_reads import open_snapshot
from spark_jobs.ops.vacuum import vacuum
from tests.support import lockstep_in_process
from tests.support.barriers import at, wait_for_barrier
from tests.support.supervising import KeyedRecords

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PIPELINE = """
CREATE TABLE events (k BIGINT, v BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE sums AS SELECT k, SUM(v) AS total FROM events GROUP BY k;
"""


def data_files(settings: Settings, table: str) -> set[Path]:
    return {p for p in Path(settings.table_location(table)).rglob("*.parquet") if "_delta_log" not in p.parts}


def test_vacuum_keeps_what_a_repeatable_read_snapshot_and_the_jobs_need(
    spark: SparkSession, run_pipeline: Callable[[str], Settings], make_topic: Callable, kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    topic = make_topic(partitions=1)
    settings = run_pipeline(PIPELINE.format(topic=topic))
    records = KeyedRecords(kafka_bootstrap, topic, keys=4, value=lambda i: i)

    def send_and_wait(n: int) -> int:
        _, b = wait_for_barrier(settings, ["events", "sums"], records.send(n), topic)
        return b

    for n in (20, 10, 10):  # each barrier with new rows MERGEs into sums and replaces its files
        send_and_wait(n)
    with open_snapshot(["sums"], "repeatable-read", settings=settings, spark=spark) as snap:
        held = snap.versions["sums"]
        before = sorted(tuple(r) for r in snap.table("sums").collect())
        for n in (10, 10):
            send_and_wait(n)
        files = data_files(settings, "sums")

        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LOCKSTEP_BOOTSTRAP": settings.bootstrap,
               "LOCKSTEP_WAREHOUSE": str(settings.warehouse), "LOCKSTEP_TOPIC_PREFIX": settings.topic_prefix,
               "LOCKSTEP_JARS": str(settings.jars.absolute())}
        dry = lockstep_in_process("vacuum", "sums", "--dry-run", "--retain-barriers", "0", env=env)
        assert dry.returncode == 0, dry.stderr[-2000:]
        assert f"versions >= {held} stay readable" in dry.stdout, dry.stdout
        assert f"keeps version {held}: lease {snap.lease_id}" in dry.stdout, dry.stdout
        assert "would delete" in dry.stdout and "would delete 0 file" not in dry.stdout, dry.stdout
        assert data_files(settings, "sums") == files  # a dry run deletes nothing
        as_json = lockstep_in_process("vacuum", "sums", "--dry-run", "--retain-barriers", "0", "--format", "json",
                                      env=env)
        assert as_json.returncode == 0, as_json.stderr[-2000:]
        (table,) = json.loads(as_json.stdout)["tables"]
        assert (table["table"], table["floor"], table["dry_run"]) == ("sums", held, True) and table["files"]
        assert any(k["version"] == held and k["reason"].startswith(f"lease {snap.lease_id}") for k in table["keeps"])

        (report,) = vacuum(spark, settings, ["sums"], retain_barriers=0)
        assert report.floor == held and report.files and not report.dry_run
        assert not any(Path(f.removeprefix("file:")).exists() for f in report.files)
        assert len(data_files(settings, "sums")) < len(files)
        # the snapshot reads its versions as before, from files that stayed
        assert sorted(tuple(r) for r in snap.table("sums").collect()) == before
    vacuum(spark, settings, retain_barriers=0)  # every table, the lease released: down to what the jobs need

    # the jobs keep committing, and their results are still right
    state_b = send_and_wait(10)
    state = read_state(settings)
    got = {r["k"]: r["total"] for r in at(spark, settings, "sums", state.exact_points("sums")[state_b]).collect()}
    totals: dict[int, int] = defaultdict(int)
    for i, k in enumerate(records.sent):
        totals[k] += i
    assert got == dict(totals)

    with pytest.raises(UnknownTables, match="unknown table"):
        vacuum(spark, settings, ["nope"])
    bad = lockstep_in_process("vacuum", "nope", env=env)
    assert bad.returncode == 1 and "unknown table(s): nope; registered: events, sums" in bad.stderr, bad.stderr
