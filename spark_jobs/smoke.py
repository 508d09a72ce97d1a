"""End-to-end smoke of the real parts: Kafka topic -> Spark batch read -> Delta table -> read back.

``lockstep demo`` runs this until the barrier-driven shopping demo exists. It proves that
the broker, the Spark Kafka source and Delta work together on this machine, and prints what
it did at each step.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from coordinator.settings import Settings

SMOKE_SCHEMA = "id BIGINT, user_id BIGINT, amount BIGINT"


@dataclass(frozen=True)
class SmokeResult:
    produced: int
    produced_amount: int
    delta_rows: int
    delta_amount: int
    delta_version: int
    table_path: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.produced == self.delta_rows and self.produced_amount == self.delta_amount


def run_smoke(
    settings: Settings, records: int = 5000, partitions: int = 3, echo: Callable[[str], None] = print
) -> SmokeResult:
    """Produce ``records`` JSON rows, copy them with Spark into Delta, read them back."""
    started = time.monotonic()
    topic = f"lockstep_smoke_{int(time.time() * 1000)}"
    admin = AdminClient(settings.kafka_config())
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)
    try:
        echo(f"created topic {topic} with {partitions} partitions")
        producer = Producer(settings.kafka_config(**{"linger.ms": 20}))
        rng = random.Random(7)
        total = 0
        for i in range(records):
            amount = rng.randint(1, 100)
            total += amount
            row = {"id": i, "user_id": i % 100, "amount": amount}
            producer.produce(topic, key=str(row["user_id"]).encode(), value=json.dumps(row).encode())
            if i % 1000 == 999:
                producer.poll(0)
                echo(f"produced {i + 1}/{records} records")
        if producer.flush(30) != 0:
            raise RuntimeError(f"could not deliver all records to {topic} within 30 s")
        echo(f"produced {records} records, amount total {total}")

        from pyspark.sql import functions as F

        from spark_jobs.session import build_session

        echo("starting Spark (local) with Delta and the Kafka source ...")
        spark = build_session("lockstep-smoke", settings=settings)
        raw = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", settings.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .load()
        )
        rows = raw.select(F.from_json(F.col("value").cast("string"), SMOKE_SCHEMA).alias("r"), "partition").select(
            "r.*", "partition"
        )
        path = str((settings.warehouse / "smoke").absolute())
        (
            rows.write.format("delta")
            .mode("overwrite")
            .option("userMetadata", json.dumps({"smoke_topic": topic}))
            .save(path)
        )
        echo(f"wrote Delta table {path}")
        table = spark.read.format("delta").load(path)
        summary = table.agg(F.count("*").alias("n"), F.sum("amount").alias("amount")).first()
        per_partition = table.groupBy("partition").count().orderBy("partition").collect()
        echo("rows per Kafka partition: " + ", ".join(f"p{r['partition']}={r['count']}" for r in per_partition))
        from delta.tables import DeltaTable

        version = DeltaTable.forPath(spark, path).history(1).first()["version"]
        return SmokeResult(
            produced=records,
            produced_amount=total,
            delta_rows=int(summary["n"]),
            delta_amount=int(summary["amount"] or 0),
            delta_version=int(version),
            table_path=path,
            seconds=time.monotonic() - started,
        )
    finally:
        admin.delete_topics([topic])
