"""An s3a:// warehouse on a real S3-API server (s3proxy, started as ``lockstep dev up --s3``
starts it): a pipeline with two root tables, an aggregate and a join runs there; read-committed
reads are consistent; vacuum deletes unneeded objects through the S3 API and every exact point
it keeps still reads; a table's files are removed from the bucket."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Message, Producer
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from lockstep.dev.s3 import LocalS3
from lockstep_reads import open_snapshot
from spark_jobs.ops.jobs import register_pipeline
from spark_jobs.ops.tables import remove_table
from spark_jobs.ops.vacuum import vacuum
from spark_jobs.planning.pipeline import parse_pipeline
from spark_jobs.runtime.session import configure_storage
from spark_jobs.runtime.storage import Storage
from tests.support.barriers import wait_for_barrier
from tests.support.supervising import supervised

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PIPELINE = """
CREATE TABLE orders (oid BIGINT, uid BIGINT, amount BIGINT) WITH ('source' = 'kafka:{orders}', 'format' = 'json');
CREATE TABLE users (id BIGINT, region STRING) WITH ('source' = 'kafka:{users}', 'format' = 'json', 'primary_key' = 'id');
CREATE TABLE per_user AS SELECT uid, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY uid;
CREATE TABLE per_region AS SELECT u.region, SUM(o.amount) AS total FROM orders o JOIN users u ON o.uid = u.id GROUP BY u.region;
"""
TABLES = ["orders", "users", "per_user", "per_region"]
REGIONS = ("north", "south", "east")


def consistent(snap: object) -> list[str]:
    """What a read-committed snapshot shows that could not be true at one barrier."""
    sql = snap.sql  # type: ignore[attr-defined]
    problems = []
    truth = {r["uid"]: (r["total"], r["n"]) for r in sql(
        "SELECT uid, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY uid").collect()}
    seen = {r["uid"]: (r["total"], r["n"]) for r in sql("SELECT uid, total, n FROM per_user").collect()}
    if truth != seen:
        problems.append(f"per_user {seen} != orders {truth}")
    truth = {r["region"]: r["total"] for r in sql("SELECT u.region, SUM(o.amount) AS total FROM orders o "
                                                  "JOIN users u ON o.uid = u.id GROUP BY u.region").collect()}
    seen = {r["region"]: r["total"] for r in sql("SELECT region, total FROM per_region").collect()}
    if truth != seen:
        problems.append(f"per_region {seen} != join {truth}")
    return problems


def test_a_pipeline_on_an_s3_warehouse_reads_consistently_and_vacuums_through_the_s3_api(
    local_s3: LocalS3, spark: SparkSession, make_worker: Callable, coordinator_env: dict[str, str],
    make_topic: Callable, kafka_bootstrap: str, tmp_path: Path,
) -> None:
    orders, users = make_topic(partitions=2), make_topic(partitions=1)
    worker = make_worker()
    prefix = f"wh{uuid.uuid4().hex[:6]}"
    settings = dataclasses.replace(Settings.from_env({**coordinator_env, **local_s3.env()}),
                                   warehouse=f"s3a://lake/{prefix}", home=tmp_path / "home", coordinator_url=worker.url)
    configure_storage(spark, settings)
    storage = Storage(spark)
    pipeline = parse_pipeline(PIPELINE.format(orders=orders, users=users))
    register_pipeline(settings, pipeline)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    sent: Counter[str] = Counter()
    ends: dict[int, int] = defaultdict(int)  # orders partition -> offset after its last record

    def delivered(err: object, msg: Message) -> None:
        assert err is None, err
        ends[msg.partition()] = max(ends[msg.partition()], msg.offset() + 1)

    def send(n: int) -> dict[int, int]:
        for i in range(n):
            oid = sent["orders"]
            producer.produce(orders, key=str(oid % 5).encode(), on_delivery=delivered,
                             value=json.dumps({"oid": oid, "uid": oid % 5, "amount": oid % 7 + 1}).encode())
            sent["orders"] += 1
            if i % 3 == 0:  # users move between regions: the join's other input changes too
                producer.produce(users, json.dumps({"id": sent["users"] % 5, "region": REGIONS[sent["users"] % 3]}).encode())
                sent["users"] += 1
        producer.flush(10)
        return dict(ends)

    reads, anomalies = 0, []
    started = time.monotonic()
    with supervised(spark, pipeline, settings, max_backoff=2):
        for n in (30, 20):
            wait_for_barrier(settings, TABLES, send(n), orders, timeout=180)
            print(f"{time.monotonic() - started:.0f} s: a barrier covers {sum(ends.values())} orders")
            with open_snapshot(TABLES, settings=settings, spark=spark) as snap:
                anomalies += consistent(snap)
                reads += 1

        # the tables are objects in the bucket, written through the S3 API
        on_server = local_s3.home / "data" / "lake" / prefix
        assert (on_server / "orders" / "_delta_log").is_dir() and any((on_server / "per_region").rglob("*.parquet"))
        assert settings.table_location("orders").startswith("s3a://lake/")

        reports = vacuum(spark, settings, TABLES, retain_barriers=0)
        print(f"{time.monotonic() - started:.0f} s: vacuumed")
        deleted = {r.table: set(r.files) for r in reports}
        assert any(deleted.values()), "the aggregates rewrite their files each barrier: some must go"
        for table, files in deleted.items():
            left = {f.uri for f in storage.files(settings.table_location(table), ".parquet")}
            assert not left & files, f"{table}: vacuumed files are still in the bucket"
        with open_snapshot(TABLES, settings=settings, spark=spark) as snap:  # the newest exact point still reads
            anomalies += consistent(snap)
            reads += 1
            assert snap.sql("SELECT COUNT(*) AS n FROM orders").first()["n"] == sum(ends.values())

    assert reads >= 3 and not anomalies, anomalies

    removed = remove_table(storage, settings, "per_region", ["maintain_per_region"])
    assert settings.table_location("per_region") in removed
    assert not storage.exists(settings.table_location("per_region"))
    assert not (local_s3.home / "data" / "lake" / prefix / "per_region").exists()
