"""Real sources: a PostgreSQL table captured by Debezium (Kafka Connect, Avro through the schema
registry) into a root table of format ``debezium-avro-confluent``, and records framed with the
registry's ids into one of format ``avro-confluent``; the checks a pipeline's start makes."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import os
import signal
import struct
import urllib.request
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from coordinator.domain.errors import UsageError
from coordinator.settings import Settings
from spark_jobs.planning.pipeline import parse_pipeline
from spark_jobs.runtime.formats import check_sources
from tests.support import wait_until
from tests.support.barriers import at, wait_for_barrier
from tests.support.cdc import CdcStack, end_offset

pytestmark = [pytest.mark.integration]
UTC = dt.UTC

SOURCE = """
CREATE TABLE {name} (
  id int PRIMARY KEY, amount numeric(10,2), ratio numeric, placed date, seen timestamp(6),
  seen_tz timestamptz, at_time time(6), token uuid, doc jsonb, status {name}_status, took interval, flag boolean
);
"""
COLUMNS = """
  id INT, amount DECIMAL(10, 2), ratio DECIMAL(20, 5), placed DATE, seen TIMESTAMP_NTZ, seen_tz TIMESTAMP,
  at_time STRING, token STRING, doc STRING, status STRING, took BIGINT, flag BOOLEAN, note STRING"""
# the same table twice: through the schema registry, and as JSON with the schema in each record
PIPELINE = f"""
CREATE TABLE orders ({COLUMNS}) WITH ('source' = 'kafka:{{topic}}', 'format' = 'debezium-avro-confluent', 'primary_key' = 'id');
CREATE TABLE orders_json ({COLUMNS}) WITH ('source' = 'kafka:{{json_topic}}', 'format' = 'debezium-json', 'primary_key' = 'id');
"""
JSON_SCHEMAS_ON = {f"{side}.converter{option}": value for side in ("key", "value") for option, value in
                   (("", "org.apache.kafka.connect.json.JsonConverter"), (".schemas.enable", "true"))}


def test_a_postgres_table_arrives_as_its_snapshot_then_its_changes_with_its_types(
    spark: SparkSession, run_pipeline: Callable[..., Settings], cdc_stack: CdcStack, kafka_bootstrap: str
) -> None:
    pg, name = cdc_stack.postgres, f"orders_{uuid.uuid4().hex[:6]}"
    pg.sql(f"CREATE TYPE {name}_status AS ENUM ('new', 'paid');" + SOURCE.format(name=name) +
           f"INSERT INTO {name} VALUES (1, 12.34, 3.14159, '2024-02-29', '2024-01-02 03:04:05.123456', "
           "'2024-01-02 03:04:05+02', '12:34:56.789', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"a\": 1}', 'new', "
           f"'1 day 2 hours', true), (2, 1.50, -7, NULL, NULL, NULL, NULL, NULL, NULL, 'paid', NULL, false);")
    topic = f"{cdc_stack.capture([f'public.{name}'])}.public.{name}"
    json_topic = f"{cdc_stack.capture([f'public.{name}'], **JSON_SCHEMAS_ON)}.public.{name}"
    for captured in (topic, json_topic):
        wait_until(lambda t=captured: end_offset(kafka_bootstrap, t) >= 2, "the snapshot's two records", timeout=60)
    settings = run_pipeline(PIPELINE.format(topic=topic, json_topic=json_topic), schema_registry_url=cdc_stack.registry.url)

    pg.sql(f"BEGIN; UPDATE {name} SET amount = 99.99, status = 'paid' WHERE id = 1; DELETE FROM {name} WHERE id = 2; "
           f"INSERT INTO {name} (id, amount) VALUES (3, 0.01); COMMIT;"
           f"ALTER TABLE {name} ADD COLUMN note text; INSERT INTO {name} (id, note) VALUES (4, 'after the new column');")
    for captured in (topic, json_topic):
        wait_until(lambda t=captured: end_offset(kafka_bootstrap, t) >= 7, "the changes' records (and a tombstone)",
                   timeout=60)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, key=b"k", value=b"{\"id\": 5}")  # not framed: a dead letter
    producer.produce(topic, key=b"k", value=b"\x00\x00\x0f\x42\x3f" + b"\x02")  # an id the registry does not know
    producer.flush(10)

    wait_for_barrier(settings, ["orders", "orders_json"], {0: end_offset(kafka_bootstrap, json_topic)}, json_topic)
    state, b = wait_for_barrier(settings, ["orders", "orders_json"], {0: end_offset(kafka_bootstrap, topic)}, topic)
    rows = {r["id"]: r.asDict() for r in at(spark, settings, "orders", state.exact_points("orders")[b]).collect()}
    as_json = {r["id"]: r.asDict() for r in at(spark, settings, "orders_json", state.exact_points("orders_json")[b]).collect()}
    assert as_json == rows, "debezium-json with schemas on fills the columns as the registry's Avro does"
    assert sorted(rows) == [1, 3, 4]
    assert rows[1] == {
        "id": 1, "amount": Decimal("99.99"), "ratio": Decimal("3.14159"), "placed": dt.date(2024, 2, 29),
        "seen": dt.datetime(2024, 1, 2, 3, 4, 5, 123456), "seen_tz": rows[1]["seen_tz"], "at_time": "12:34:56.789000",
        "token": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "doc": '{"a": 1}', "status": "paid",
        "took": 93_600_000_000, "flag": True, "note": None}
    assert rows[1]["seen_tz"].astimezone(UTC) == dt.datetime(2024, 1, 2, 1, 4, 5, tzinfo=UTC)  # the instant
    assert (rows[3]["amount"], rows[3]["note"], rows[4]["note"]) == (Decimal("0.01"), None, "after the new column")
    dead = sorted(r["error"] for r in spark.read.format("delta").load(settings.table_location("orders__dlq")).collect())
    assert len(dead) == 2
    assert dead[0].startswith("record value does not start with the Confluent framing's zero byte")
    assert dead[1] == f"schema id 999999 is not in the schema registry at {cdc_stack.registry.url}"


def register(registry_url: str, subject: str, schema: dict[str, Any]) -> int:
    request = urllib.request.Request(f"{registry_url}/subjects/{subject}/versions", method="POST",
                                     data=json.dumps({"schema": json.dumps(schema)}).encode(),
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(json.loads(response.read())["id"])


def framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO(b"\x00" + struct.pack(">I", schema_id))
    out.seek(5)
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def test_records_of_two_schema_versions_fill_an_avro_confluent_table_and_wait_for_the_registry(
    spark: SparkSession, run_pipeline: Callable[..., Settings], cdc_stack: CdcStack, make_topic: Callable,
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic, url = make_topic(partitions=1), cdc_stack.registry.url
    millis = {"type": "long", "logicalType": "timestamp-millis"}
    v1 = {"type": "record", "name": "Click", "fields": [{"name": "user_id", "type": "long"}, {"name": "at", "type": millis}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "page", "type": ["null", "string"], "default": None}]}
    id1, id2 = register(url, f"{topic}-value", v1), register(url, f"{topic}-value", v2)
    assert id1 != id2
    settings = run_pipeline(f"CREATE TABLE clicks (user_id BIGINT, at TIMESTAMP, page STRING) "
                            f"WITH ('source' = 'kafka:{topic}', 'format' = 'avro-confluent')", schema_registry_url=url)
    at_ms = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, value=framed(id1, v1, {"user_id": 1, "at": at_ms}))
    producer.produce(topic, value=framed(id2, v2, {"user_id": 2, "at": at_ms, "page": "/cart"}))
    producer.flush(10)
    state, b = wait_for_barrier(settings, ["clicks"], {0: 2}, topic)
    rows = sorted((r["user_id"], r["at"].astimezone(UTC), r["page"])
                  for r in at(spark, settings, "clicks", state.exact_points("clicks")[b]).collect())
    assert rows == [(1, at_ms, None), (2, at_ms, "/cart")]

    # the registry stops answering (paused, so it keeps its schemas): barriers wait, nothing is rejected
    registry_pid = cdc_stack.registry.running_pid()
    assert registry_pid is not None
    os.kill(registry_pid, signal.SIGSTOP)
    try:
        with caplog.at_level(logging.WARNING, logger="spark_jobs.runtime.ingest"):
            producer.produce(topic, value=framed(id2, v2, {"user_id": 3, "at": at_ms, "page": "/pay"}))
            producer.flush(10)
            wait_until(lambda: "table clicks waits for the schema registry" in caplog.text, "the wait said", timeout=60)
    finally:
        os.kill(registry_pid, signal.SIGCONT)
    state, b = wait_for_barrier(settings, ["clicks"], {0: 3}, topic)
    assert at(spark, settings, "clicks", state.exact_points("clicks")[b]).count() == 3
    assert sum(c.rows_rejected for c in state.completions["clicks"].values()) == 0


def test_a_pipeline_whose_columns_its_registered_schema_cannot_fill_is_refused_before_it_starts(
    cdc_stack: CdcStack, make_topic: Callable
) -> None:
    topic, url = make_topic(partitions=1), cdc_stack.registry.url
    register(url, f"{topic}-value", {"type": "record", "name": "Visit", "fields": [
        {"name": "id", "type": "long"}, {"name": "day", "type": {"type": "int", "connect.name": "io.debezium.time.Date"}}]})
    pipeline = parse_pipeline(f"CREATE TABLE visits (id BIGINT, day BIGINT) "
                              f"WITH ('source' = 'kafka:{topic}', 'format' = 'avro-confluent')")
    with pytest.raises(UsageError, match=r"table visits: schema id \d+ of subject .*: column day: the source writes int "
                                         r"\(io.debezium.time.Date\), .* declare it as STRING or DATE"):
        check_sources(pipeline.roots, url)
    base = url.removesuffix("/apis/ccompat/v7")
    with pytest.raises(UsageError, match=f"LOCKSTEP_SCHEMA_REGISTRY_URL={base} is not a Confluent-compatible"):
        check_sources(pipeline.roots, base)
    with pytest.raises(UsageError, match="does not answer .*start it, or fix LOCKSTEP_SCHEMA_REGISTRY_URL"):
        check_sources(pipeline.roots, "http://127.0.0.1:9/apis/ccompat/v7")
    with pytest.raises(UsageError, match="no schema registry: set LOCKSTEP_SCHEMA_REGISTRY_URL"):
        check_sources(pipeline.roots, "")
