"""The light read path over a running pipeline: every read level means what Spark's
``open_snapshot`` means (the same barrier, versions and rows), a repeatable-read lease holds
and goes, and what cannot be read says why."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time

import pytest
from pyspark.sql import SparkSession

import coordinator.client.snapshots as snapshots
from coordinator.client.rest import get_json
from coordinator.client.snapshots import CoordinatorUnreachable, SnapshotError, pin
from coordinator.client.state import read_state
from coordinator.settings import Settings
from lockstep.dev.broker import free_port
from lockstep_reads import QueryError, Refused, VersionGone, open_snapshot, query
from spark_jobs.ops.vacuum import vacuum
from tests.support import ROOT
from tests.support.barriers import wait_for_barrier
from tests.support.clicks import TABLES, Clicks

pytestmark = [pytest.mark.integration, pytest.mark.slow]
CHECK = ("SELECT p.page, p.views, c.views AS counted, p.users, c.users AS distinct_users FROM per_page p JOIN "
         "(SELECT page, COUNT(*) AS views, COUNT(DISTINCT \"user\") AS users FROM clicks GROUP BY page) c USING (page)")

def rows(table: object) -> list[tuple]:
    return sorted(tuple(r.values()) for r in table.to_pylist())  # type: ignore[attr-defined]


def test_each_read_level_reads_what_spark_reads_and_what_cannot_be_read_says_why(
        clicks_pipeline: tuple[Settings, Clicks], spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """One pipeline for several reads (each pipeline costs the suite most of a minute)."""
    settings, clicks = clicks_pipeline
    read_levels(settings, clicks, spark)
    lockstep_query_without_pyspark(settings, clicks)
    errors(settings)
    vacuumed_under_a_read(settings, clicks, spark, monkeypatch)  # last: it vacuums per_page


def read_levels(settings: Settings, clicks: Clicks, spark: SparkSession) -> None:
    with open_snapshot(TABLES, settings=settings) as snap:
        assert snap.barrier is not None and set(snap.versions) == set(TABLES) and not snap.leases
        per_page = snap.table("per_page")
        assert per_page.column_names == ["page", "views", "users", "avg_ms"]  # no bookkeeping columns
        consistent = snap.sql(CHECK).to_pylist()
        assert consistent and all(r["views"] == r["counted"] and r["users"] == r["distinct_users"] for r in consistent)
        with open_snapshot(TABLES, as_of_barrier=snap.barrier, settings=settings, spark=spark) as same:
            assert same.versions == snap.versions
            assert rows(per_page) == sorted(tuple(r) for r in same.table("per_page").collect())
    # where each table lives, for any engine that reads Delta at a version
    body = get_json(settings, "/snapshot?tables=per_page")
    assert body["locations"] == {"per_page": settings.table_location("per_page")} and "storage" not in body

    result = query("SELECT SUM(views) AS n FROM per_page", settings=settings)
    assert result.barrier is not None and result.barrier >= snap.barrier and set(result.versions) == {"per_page"}
    assert result.table.to_pylist()[0]["n"] >= 40
    past = query("SELECT COUNT(*) AS n FROM clicks", as_of_barrier=snap.barrier, settings=settings)
    assert (past.barrier, past.versions["clicks"]) == (snap.barrier, snap.versions["clicks"])
    at_time = query("SELECT COUNT(*) AS n FROM clicks", as_of_timestamp=snap.data_ts_ms, settings=settings)
    assert at_time.barrier == snap.barrier and at_time.table.equals(past.table)

    uncommitted = query("SELECT COUNT(*) AS n FROM clicks", "read-uncommitted", settings=settings)
    assert uncommitted.barrier is None and isinstance(uncommitted.versions["clicks"], int)

    lineage = query("SELECT T.table_name FROM __META_ETL_SINK T JOIN __META_ETL_SOURCE S ON T.job_id = S.job_id "
                    "WHERE S.table_name = 'clicks'", settings=settings)
    assert lineage.table.to_pylist() == [{"table_name": "per_page"}]

    # a repeatable-read snapshot reads the same rows while barriers pass, under a lease it releases
    with open_snapshot(TABLES, "repeatable-read", settings=settings) as held:
        lease = read_state(settings).leases[held.lease_id]
        assert lease.barrier == held.barrier and {v.table for v in lease.versions} == set(TABLES)
        first = rows(held.sql(CHECK))
        wait_for_barrier(settings, TABLES, clicks.send(30), clicks.topic)
        assert rows(held.sql(CHECK)) == first
        assert query("SELECT SUM(views) AS n FROM per_page", settings=settings).table.to_pylist()[0]["n"] == 70
        lease_id = held.lease_id
    assert lease_id not in read_state(settings).leases


def lockstep_query_without_pyspark(settings: Settings, clicks: Clicks) -> None:
    """``lockstep query`` in a process where pyspark cannot be imported: no JVM either."""
    env = {"PATH": "/usr/bin:/bin", "LOCKSTEP_BOOTSTRAP": settings.bootstrap, "LOCKSTEP_WAREHOUSE": settings.warehouse,
           "LOCKSTEP_COORDINATOR_URL": settings.coordinator_url, "LOCKSTEP_TOPIC_PREFIX": settings.topic_prefix}
    blocked = ("import sys\nfor name in ('pyspark', 'py4j', 'delta'):\n    sys.modules[name] = None\n"
               "from lockstep.cli import main\nmain()\n")
    done = subprocess.run([sys.executable, "-c", blocked, "query", "SELECT page, views FROM per_page ORDER BY page",
                           "--format", "json", "--consistency", "repeatable-read"],
                          env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert sum(json.loads(line)["views"] for line in done.stdout.splitlines()) == clicks.sent
    assert re.fullmatch(r"barrier \d+; versions per_page=\d+\n", done.stderr)


def errors(settings: Settings) -> None:
    with pytest.raises(SnapshotError, match="unknown table.*nope"):
        query("SELECT * FROM nope", settings=settings)
    with pytest.raises(Refused, match="DELETE is not allowed"):
        query("DELETE FROM clicks", settings=settings)
    with open_snapshot(["clicks"], settings=settings) as snap, \
            pytest.raises(SnapshotError, match="'per_page' is not part of this snapshot"):
        snap.sql("SELECT * FROM per_page")
    with pytest.raises(QueryError, match="(?i)no field named nope"):
        query("SELECT nope FROM clicks", settings=settings)
    down = dataclasses.replace(settings, coordinator_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(CoordinatorUnreachable, match="not reachable at http://127.0.0.1"):
        query("SELECT * FROM clicks", settings=down)


def vacuumed_under_a_read(settings: Settings, clicks: Clicks, spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """A version vacuumed under a read: read-committed reads again at the newest barrier; a
    pinned past is an error."""
    old = read_state(settings).common_barrier(TABLES)
    assert old is not None
    for _ in range(3):  # per_page rewrites its one file at each barrier that changes it
        wait_for_barrier(settings, TABLES, clicks.send(5), clicks.topic)
        time.sleep(0.3)
    vacuum(spark, settings, ["per_page"], retain_barriers=0)
    with pytest.raises(VersionGone, match="gone|no longer available"):
        query("SELECT * FROM per_page", as_of_barrier=old, settings=settings)

    asked: list[int | None] = []

    def stale_first(settings: Settings, tables: list[str], level: str, *args: object) -> object:
        """The coordinator's real answer, the first time for the vacuumed barrier (as if the
        read had been pinned just before vacuum ran)."""
        pinned = pin(settings, tables, level, old if not asked else None)
        asked.append(pinned.barrier)
        return pinned

    monkeypatch.setattr(snapshots, "pin", stale_first)  # where every open_snapshot pins
    result = query("SELECT SUM(views) AS n FROM per_page", settings=settings)
    assert asked[0] == old and result.barrier == asked[-1] and result.barrier > old
    assert result.table.to_pylist()[0]["n"] == clicks.sent
