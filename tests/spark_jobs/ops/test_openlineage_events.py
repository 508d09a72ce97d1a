"""OpenLineage run events, sent over the HTTP transport to a real local endpoint (the runner's
own start/stop path is covered in test_runner.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from coordinator.settings import Settings
from spark_jobs.ops.hooks import JobEvent
from spark_jobs.ops.openlineage_events import OpenLineageEvents
from spark_jobs.planning.pipeline import parse_pipeline
from tests.support.http_sink import HttpSink

PIPELINE = """
CREATE TABLE orders (id BIGINT, user_id BIGINT, amount BIGINT) WITH ('source' = 'kafka:orders');
CREATE TABLE spend AS SELECT user_id, SUM(amount) AS total FROM orders GROUP BY user_id;
"""


def test_runs_start_fail_restart_and_complete_with_their_datasets(
    make_http_sink: Callable[[], HttpSink], tmp_path: Path,
) -> None:
    sink = make_http_sink()
    settings = Settings(bootstrap="127.0.0.1:9092", warehouse=str(tmp_path / "wh"), openlineage=sink.url)
    hooks = OpenLineageEvents(settings, parse_pipeline(PIPELINE))
    hooks.on_created(JobEvent("ingest_orders", "orders", "RUNNING"))
    hooks.on_created(JobEvent("maintain_spend", "spend", "RUNNING"))
    hooks.on_failed(JobEvent("maintain_spend", "spend", "RUNNING", error="Py4JJavaError: boom"))
    hooks.on_finished(JobEvent("maintain_spend", "spend", "FINISHED"))
    hooks.on_canceled(JobEvent("ingest_orders", "orders", "CANCELED"))

    events = sink.bodies("/api/v1/lineage")
    assert [(e["job"]["name"], e["eventType"]) for e in events] == [
        ("ingest_orders", "START"), ("maintain_spend", "START"), ("maintain_spend", "FAIL"),
        ("maintain_spend", "START"), ("maintain_spend", "COMPLETE"), ("ingest_orders", "ABORT")]
    spend = [e for e in events if e["job"]["name"] == "maintain_spend"]
    assert spend[0]["run"]["runId"] == spend[1]["run"]["runId"] != spend[2]["run"]["runId"] == spend[3]["run"]["runId"]
    assert spend[1]["run"]["facets"]["errorMessage"]["message"] == "Py4JJavaError: boom"
    # the graph: topic -> orders -> spend, with the schema and column lineage
    root = events[0]
    assert [(d["namespace"], d["name"]) for d in root["inputs"]] == [("kafka://127.0.0.1:9092", "orders")]
    assert [(d["namespace"], d["name"]) for d in root["outputs"]] == [("file", str(tmp_path / "wh" / "orders"))]
    assert [f["name"] for f in root["outputs"][0]["facets"]["schema"]["fields"]] == ["id", "user_id", "amount"]
    assert [d["name"] for d in spend[0]["inputs"]] == [str(tmp_path / "wh" / "orders")]
    total = spend[0]["outputs"][0]["facets"]["columnLineage"]["fields"]["total"]["inputFields"]
    assert [(f["name"], f["field"]) for f in total] == [(str(tmp_path / "wh" / "orders"), "amount")]
    assert "SUM(amount)" in spend[0]["job"]["facets"]["sql"]["query"]
    assert root["job"]["namespace"] == settings.topic_prefix


def test_a_file_transport_writes_one_event_per_line(tmp_path: Path) -> None:
    target = tmp_path / "lineage.jsonl"
    settings = dataclasses.replace(Settings(), openlineage=f"file:{target}")
    hooks = OpenLineageEvents(settings, parse_pipeline(PIPELINE))
    hooks.on_created(JobEvent("ingest_orders", "orders", "RUNNING"))
    hooks.on_finished(JobEvent("ingest_orders", "orders", "FINISHED"))
    assert [line.count('"eventType"') for line in target.read_text().splitlines()] == [1, 1]
