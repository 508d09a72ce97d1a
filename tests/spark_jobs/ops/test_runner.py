"""Stopping jobs: `lockstep stop` records the end, the Supervisor stops the job and tells the
hooks, delays and lineage show it, and running the pipeline again continues where it stopped."""

from __future__ import annotations

import dataclasses
import re
import time
from collections import Counter
from collections.abc import Callable

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from coordinator.client.rest import get_json
from coordinator.client.state import read_state
from coordinator.settings import CrashAt
from spark_jobs.api.lineage import lineage_frames
from spark_jobs.ops.hooks import JobEvent, JobHooks
from spark_jobs.ops.jobs import register_pipeline
from spark_jobs.planning.pipeline import parse_pipeline
from spark_jobs.runtime.job_metrics import job_metrics
from tests.support import wait_until
from tests.support.barriers import at, wait_for_barrier
from tests.support.http_sink import HttpSink
from tests.support.supervising import KeyedRecords, Recorder, Stack, supervised

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PIPELINE = """
CREATE TABLE events (k BIGINT, v BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE sums AS SELECT k, SUM(v) AS total FROM events GROUP BY k;
CREATE TABLE counts AS SELECT k, COUNT(*) AS n FROM events GROUP BY k;
"""


class Broken(JobHooks):
    def on_created(self, event: JobEvent) -> None:
        raise ValueError("a broken hook")


def test_stop_finishes_or_cancels_a_job_and_run_again_continues_it(
    spark: SparkSession, make_stack: Callable[[], Stack], make_topic: Callable, kafka_bootstrap: str,
    make_http_sink: Callable[[], HttpSink],
) -> None:
    topic = make_topic(partitions=1)
    stack = make_stack()
    lineage = make_http_sink()  # OpenLineage's HTTP transport posts the runs' events here
    settings = dataclasses.replace(stack.settings, openlineage=lineage.url)
    pipeline = parse_pipeline(PIPELINE.format(topic=topic))
    register_pipeline(settings, pipeline)
    hooks, reports = Recorder(), []
    records = KeyedRecords(kafka_bootstrap, topic, value=lambda i: i)
    send, sent = records.send, records.sent
    with supervised(spark, pipeline, settings, report=reports.append, hooks=[Broken(), hooks],
                    follow_status=True) as supervisor:
        assert [what for what, _ in hooks.events] == ["created"] * 3  # the broken hook did not stop the others
        assert sum("Broken.on_created failed" in r for r in reports) == 3
        wait_for_barrier(settings, ["events", "sums", "counts"], send(30), topic)

        # FINISHED, named by its table: stopped after the barrier in progress, not restarted
        done = stack.lockstep("stop", "counts", "--reason", "no longer needed")
        assert done.returncode == 0, done.stderr
        assert "job maintain_counts recorded FINISHED" in done.stdout
        wait_until(lambda: "maintain_counts" in supervisor.ended, "the supervisor stops maintain_counts")
        assert supervisor.ended == {"maintain_counts": "FINISHED"}
        assert hooks.of("maintain_counts") == ["created", "finished"]
        assert hooks.events[-1][1] == JobEvent("maintain_counts", "counts", "FINISHED", "no longer needed")
        state, b = wait_for_barrier(settings, ["events", "sums"], send(30), topic)
        last_counts = max(state.exact_points("counts").values())
        assert state.latest_exact("counts") < b
        history = DeltaTable.forPath(spark, settings.table_location("counts")).history(1).collect()
        assert history[0]["version"] == last_counts  # nothing was committed after its last completion
        assert "maintain_counts" not in supervisor.failures

        # delays and lineage show it
        delays = get_json(settings, "/delays")
        assert delays["jobs"]["maintain_counts"]["status"] == "FINISHED"
        assert delays["tables"]["counts"]["writer"] is None and delays["bottleneck"] != "maintain_counts"
        sinks = {r["job_id"]: r["status"] for r in lineage_frames(spark, state)["__meta_etl_sink"].collect()}
        assert sinks == {"ingest_events": "RUNNING", "maintain_sums": "RUNNING", "maintain_counts": "FINISHED"}
        table_view = stack.lockstep("delays")
        assert "FINISHED" in table_view.stdout, table_view.stdout

        # CANCELED at once; a second stop and an unknown job are rejected
        canceled = stack.lockstep("stop", "ingest_events", "--cancel")
        assert canceled.returncode == 0 and "recorded CANCELED" in canceled.stdout, canceled.stderr
        wait_until(lambda: "ingest_events" in supervisor.ended, "the supervisor stops ingest_events")
        assert hooks.of("ingest_events") == ["created", "canceled"]
        assert "lockstep stop by" in hooks.events[-1][1].reason
        again_stop = stack.lockstep("stop", "ingest_events")
        assert again_stop.returncode == 1 and "already ended as CANCELED" in again_stop.stderr
        unknown = stack.lockstep("stop", "nope")
        assert unknown.returncode == 1 and "unknown job 'nope'" in unknown.stderr
        assert set(supervisor.queries) == {"maintain_sums"}
        send(30)  # not ingested while the job is stopped

        # running the pipeline again continues both from their tables' newest exact points
        register_pipeline(settings, pipeline)
        with supervised(spark, pipeline, settings, only=("ingest_events", "maintain_counts"), report=reports.append):
            state, b = wait_for_barrier(settings, ["events", "sums", "counts"], {0: len(sent)}, topic)
        events = at(spark, settings, "events", state.exact_points("events")[b]).collect()
        assert sorted(r["v"] for r in events) == list(range(len(sent)))  # no record skipped, none twice
        assert {r["k"]: r["n"] for r in at(spark, settings, "counts", state.exact_points("counts")[b]).collect()} == \
            dict(Counter(sent))
        assert {j: s.status for j, s in read_state(settings).jobs.items()} == dict.fromkeys(
            ["ingest_events", "maintain_sums", "maintain_counts"], "RUNNING")
    runs: dict[str, list[str]] = {}
    for event in lineage.bodies("/api/v1/lineage"):
        runs.setdefault(event["job"]["name"], []).append(event["eventType"])
    assert runs == {"ingest_events": ["START", "ABORT", "START"], "maintain_counts": ["START", "COMPLETE", "START"],
                    "maintain_sums": ["START"]}  # stopping the Supervisor of a test says nothing: the jobs stay RUNNING


def test_a_live_runner_keeps_its_pending_ctas_table_however_long_the_first_commit_takes(
    spark: SparkSession, make_stack: Callable[[], Stack], make_topic: Callable, coordinator_env: dict[str, str],
) -> None:
    # a pending table silent for 5 s is dropped (a shorter window is missed by a busy machine's renewals)
    coordinator_env["LOCKSTEP_JOB_LIVENESS_MS"] = "2500"
    stack = make_stack()
    settings = stack.settings
    pipeline = parse_pipeline(PIPELINE.format(topic=make_topic(partitions=1)))
    register_pipeline(settings, pipeline)
    # only the CTAS job runs: events gets no exact point, so sums cannot make its first commit
    with supervised(spark, pipeline, settings, only=["maintain_sums"]) as supervisor:
        time.sleep(12)  # more than twice what the leader waits for a sign of life
        topology = get_json(settings, "/topology")
        assert "sums" in topology["pending"] and supervisor.queries["maintain_sums"].isActive
        assert read_state(settings).jobs["maintain_sums"].status == "RUNNING"
    # the runner is gone (stopped without its hooks, as if killed): the leader drops the table
    wait_until(lambda: "sums" not in get_json(settings, "/topology")["pending"], "the abandoned table dropped", timeout=30)
    job = read_state(settings).jobs["maintain_sums"]
    assert job.status == "FAILED" and "before the first commit of sums" in job.reason
    assert "counts" not in get_json(settings, "/topology")["pending"]  # its runner never started: dropped too


def test_a_job_run_again_far_behind_reports_its_progress_until_it_caught_up(
    spark: SparkSession, make_stack: Callable[[], Stack], make_topic: Callable, kafka_bootstrap: str,
) -> None:
    topic = make_topic(partitions=1)
    stack = make_stack()
    settings = stack.settings
    pipeline = parse_pipeline(PIPELINE.format(topic=topic).split(";")[0] + ";")  # events alone
    register_pipeline(settings, pipeline)
    records = KeyedRecords(kafka_bootstrap, topic)
    with supervised(spark, pipeline, settings, follow_status=True) as supervisor:
        wait_for_barrier(settings, ["events"], records.send(10), topic)
        assert stack.lockstep("stop", "events").returncode == 0
        wait_until(lambda: "ingest_events" in supervisor.ended, "the job stopped")
    stopped_at = read_state(settings).latest_exact("events") or 0
    records.send(10)
    # no job holds barriers back meanwhile: they go on, every 200 ms
    wait_until(lambda: read_state(settings).last_barrier() > stopped_at + 40, "barriers while the job is stopped", 60)
    register_pipeline(settings, pipeline)
    reports: list[str] = []
    with supervised(spark, pipeline, settings, report=reports.append, follow_status=True):
        wait_until(lambda: any(r.startswith("caught up: ") for r in reports), lambda: f"caught up; reports: {reports}", 120)
    progress = [r for r in reports if r.startswith("catching up to barrier ")]
    assert progress and "ingest_events at barrier" in progress[0] and " behind" in progress[0], reports
    assert reports.index(progress[0]) < next(i for i, r in enumerate(reports) if r.startswith("caught up: "))


def test_the_watchdog_restarts_a_job_whose_spark_action_hangs(
    spark: SparkSession, make_stack: Callable[[], Stack], make_topic: Callable, kafka_bootstrap: str,
) -> None:
    topic = make_topic(partitions=1)
    stack = make_stack()
    # the job's first barrier runs a Spark action that never ends (once in this process). The bound
    # is 10 s: the restarted job then gets 20 s, and late in a long suite on a busy 2-core machine a
    # restarted query went more than 10 s between two Spark jobs of its first barrier (CI, 2026-12-06)
    settings = dataclasses.replace(stack.settings, crash_at=CrashAt("hang_before_commit"), stuck_after_s=10)
    pipeline = parse_pipeline(PIPELINE.format(topic=topic).split(";")[0] + ";")  # events alone
    register_pipeline(settings, pipeline)
    hooks, reports = Recorder(), []
    records = KeyedRecords(kafka_bootstrap, topic)
    stuck = lambda: job_metrics.registry.get_sample_value("lockstep_job_stuck_restarts_total",  # noqa: E731
                                                          {"job": "ingest_events"}) or 0
    stuck_before = stuck()
    with supervised(spark, pipeline, settings, report=reports.append, hooks=[hooks]) as supervisor:
        state, b = wait_for_barrier(settings, ["events"], records.send(10), topic, timeout=120)
        assert supervisor.failures == {"ingest_events": 1}, reports
    said = [r for r in reports if "ingest_events is stuck" in r]
    assert said and re.search(r"its table holds barrier \d+ while barrier \d+ is ready", said[0]), reports
    assert any(r.startswith("job ingest_events restarted (attempt 2)") for r in reports), reports
    assert hooks.of("ingest_events") == ["created", "failed"] and hooks.events[-1][1].error.startswith("stuck: ")
    assert stuck() == stuck_before + 1
    events = at(spark, settings, "events", state.exact_points("events")[b]).collect()
    assert sorted(r["v"] for r in events) == [1] * 10  # the barrier the hang held up is in, once


def test_a_strided_table_is_not_reported_behind_for_the_barriers_it_folds() -> None:
    from coordinator.domain import BarrierAnnounced, BarrierCompleted, JobState, TableState, TableStride, fold_all
    from spark_jobs.ops.runner import barriers_behind

    every10 = (TableStride("slow", 10, 9_000, 1_000),)
    state = fold_all([TableState("events", "root"), TableState("slow", "derived"),
                      JobState("ingest", "events", external_topics=("x",)), JobState("big", "slow", sources=("events",)),
                      *[BarrierAnnounced(b, b, strides=every10) for b in range(1, 20)],
                      *[BarrierCompleted("ingest", "events", b, 0, b) for b in range(1, 20)],
                      BarrierCompleted("big", "slow", 10, 0, 1)])
    assert barriers_behind(state, ["ingest", "big"]) == {"ingest": (19, 0), "big": (10, 0)}
    unstrided = fold_all([BarrierAnnounced(19, 19)], state)  # the newest barrier strides nothing
    assert barriers_behind(unstrided, ["big"]) == {"big": (10, 9)}
