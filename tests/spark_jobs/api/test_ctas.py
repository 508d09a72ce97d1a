"""CREATE TABLE AS SELECT is atomic and isolated: hidden until its first barrier is committed,
created by that very commit, and gone without a trace if its job fails before it."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from coordinator.client.rest import get_json
from coordinator.client.state import read_state
from coordinator.domain.errors import Rejected
from coordinator.domain.snapshot import resolve_snapshot
from spark_jobs.api.ctas import ContinuousQuery, CtasError
from spark_jobs.ops.jobs import register_pipeline
from spark_jobs.planning.pipeline import parse_pipeline
from tests.support import wait_until
from tests.support.barriers import at, wait_for_barrier
from tests.support.supervising import KeyedRecords, Recorder, Stack, supervised

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PIPELINE = """
CREATE TABLE events (k BIGINT, v BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE totals AS SELECT k, SUM(v) AS total FROM events GROUP BY k;
CREATE TABLE broken AS SELECT k, CAST(assert_true(v < 0) AS INT) AS negative FROM events;
"""
# (assert_true alone is of type NULL, and Delta drops NULL-typed columns from what it writes, so
# the assertion would never be evaluated: the CAST makes it a column that is written.)


def test_ctas_appears_at_its_first_commit_and_a_failed_one_leaves_nothing(
    spark: SparkSession, make_stack: Callable[[], Stack], make_topic: Callable, kafka_bootstrap: str,
) -> None:
    topic = make_topic(partitions=1)
    stack = make_stack()
    settings = stack.settings
    pipeline = parse_pipeline(PIPELINE.format(topic=topic))
    records = KeyedRecords(kafka_bootstrap, topic, value=lambda i: i)
    records.send(20)  # before the jobs' first barrier, whose cut then covers them
    register_pipeline(settings, pipeline)

    # declared, but in no listing and unreadable until a barrier is committed
    topology = get_json(settings, "/topology")
    assert set(topology["tables"]) == {"events"} and topology["pending"] == ["broken", "totals"]
    with pytest.raises(Rejected, match="being created"):
        resolve_snapshot(read_state(settings), ["totals"])

    hooks, reports = Recorder(), []
    with supervised(spark, pipeline, settings, report=reports.append, hooks=[hooks], max_restarts=0) as supervisor:
        state, b = wait_for_barrier(settings, ["events", "totals"], {0: 20}, topic)
        wait_until(lambda: "maintain_broken" in supervisor.ended, "the supervisor gives maintain_broken up")
        wait_until(lambda: "broken" not in get_json(settings, "/topology")["pending"], "broken is dropped")
        # every v >= 0, so `broken` failed on its first barrier

        # the same from Python: a query previewed as a DataFrame, then saved as a maintained table
        query = ContinuousQuery(spark, "SELECT k, MAX(v) AS top FROM events GROUP BY k", settings)
        preview = {r["k"]: r["top"] for r in query.frame().collect()}
        tops = query.save_as("tops").option("max_restarts", 2).create()
        state = read_state(settings)
        first_tops = min(state.exact_points("tops"))
        assert {r["k"]: r["top"] for r in at(spark, settings, "tops", state.exact_points("tops")[first_tops]).collect()} \
            == preview  # no record arrived since the preview: the same rows
        assert query.save_as("tops").create_if_not_exists() is None
        with pytest.raises(CtasError, match="exists already"):
            query.save_as("tops").create()
        tops.stop()
        assert read_state(settings).jobs["maintain_tops"].status == "FINISHED"
        failing = ContinuousQuery(spark, "SELECT k, CAST(assert_true(v < 0) AS INT) AS negative FROM events", settings)
        renewing = [t for t in threading.enumerate() if t.name == "lockstep-renewals"]
        with pytest.raises(CtasError, match="failed before its first commit"):
            failing.save_as("negatives").create()
        assert [t for t in threading.enumerate() if t.name == "lockstep-renewals"] == renewing  # its own stopped
        assert "negatives" not in read_state(settings).tables
        assert not Path(settings.table_location("negatives")).exists()

    # the failed CTAS: no catalog entry, no files, the job recorded FAILED
    state = read_state(settings)
    assert "broken" not in state.tables
    assert not Path(settings.table_location("broken")).exists()
    assert state.jobs["maintain_broken"].status == "FAILED"
    assert "failed 1 time(s)" in state.jobs["maintain_broken"].reason
    assert hooks.of("maintain_broken") == ["created", "failed"]
    assert any("table broken dropped" in r for r in reports), reports

    # the successful one: listed now, and its very first Delta version is its first exact point
    assert set(get_json(settings, "/topology")["tables"]) == {"events", "totals", "tops"}
    first = min(state.exact_points("totals"))
    history = DeltaTable.forPath(spark, settings.table_location("totals")).history().orderBy("version").collect()
    assert history[0]["version"] == 0 and state.exact_points("totals")[first] == 0
    assert history[0]["operation"] != "CREATE TABLE"  # created by the write itself, never empty
    events = at(spark, settings, "events", state.exact_points("events")[first]).collect()
    expected = Counter()
    for r in events:
        expected[r["k"]] += r["v"]
    assert {r["k"]: r["total"] for r in at(spark, settings, "totals", 0).collect()} == dict(expected)
    assert DeltaTable.forPath(spark, settings.table_location("totals")).detail().first()["properties"].get(
        "delta.enableChangeDataFeed") == "true"

    # IF NOT EXISTS on an existing table made by another statement does nothing
    other = parse_pipeline(PIPELINE.format(topic=topic).split(";")[0] + ";"
                           "CREATE TABLE IF NOT EXISTS totals AS SELECT k, COUNT(*) AS n FROM events GROUP BY k;")
    assert register_pipeline(settings, other).derived == ()
    assert read_state(settings).jobs["maintain_totals"].sql == pipeline.table("totals").query


def test_the_handle_of_a_running_ctas_table_is_running_table_and_its_old_name_warns() -> None:
    import spark_jobs.api.ctas as ctas
    from spark_jobs.api import RunningTable
    from spark_jobs.runtime.maintenance.table import MaintainedTable

    with pytest.warns(DeprecationWarning, match="it is RunningTable"):
        assert ctas.MaintainedTable is RunningTable
    assert RunningTable is not MaintainedTable
