"""Root ingestion: barrier ``b`` reads exactly ``[cut(b-1), cut(b))`` of the table's topic.

JSON records are parsed against the table's columns. Records that are not JSON objects or
whose values do not fit a column go to ``<table>__dlq`` with the raw bytes, topic,
partition, offset and the reason; they are counted in the completion, never dropped.
Append-only tables append; tables with a primary key MERGE, the last change per key inside
the barrier winning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from coordinator.stream.coordinator import now_ms
from spark_jobs.commits import CompletionPublisher, DeltaSink
from spark_jobs.epochs import BarrierWork
from spark_jobs.pipeline import RootTable

CORRUPT = "_lockstep_corrupt"
DLQ_SCHEMA = "raw_key BINARY, raw_value BINARY, topic STRING, `partition` INT, `offset` BIGINT, error STRING, barrier BIGINT"
INTEGRAL = {"TINYINT", "SMALLINT", "INT", "BIGINT"}
FRACTIONAL = {"FLOAT", "DOUBLE"}


def fits(kind: str, value: object) -> bool:
    """Whether a JSON value can fill a column of Spark type ``kind`` (other types: not checked)."""
    if kind == "BOOLEAN":
        return isinstance(value, bool)
    if kind == "STRING":
        return isinstance(value, str)
    if kind in INTEGRAL:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in FRACTIONAL:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind.startswith("DECIMAL"):
        return isinstance(value, int | float | str)
    return True


def dlq_reason(value: bytes | None, table: RootTable) -> str:
    """Why a record was rejected, in words a person can act on."""
    if value is None:
        return "empty record value (a Kafka tombstone); a root table of format json needs a JSON object"
    try:
        record = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        return f"malformed JSON: {exc}"
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    for column in table.columns:
        v = record.get(column.name)
        if v is None:
            if column.name in table.primary_key:
                return f"primary key column {column.name} is missing or null"
            continue
        kind = column.type.upper()
        if not fits(kind, v):
            return f"column {column.name}: expected {kind}, got {type(v).__name__} {json.dumps(v)[:40]}"
    return "record does not fit the table schema"


@dataclass
class RootIngestion:
    spark: SparkSession
    table: RootTable
    job_id: str
    warehouse: Path
    publisher: CompletionPublisher
    bootstrap: str

    def __post_init__(self) -> None:
        self.sink = DeltaSink(self.spark, str(self.warehouse / self.table.name), self.job_id, self.table.schema_ddl)
        self.dlq = DeltaSink(self.spark, str(self.warehouse / f"{self.table.name}__dlq"), f"{self.job_id}__dlq", DLQ_SCHEMA)

    def read_range(self, work: BarrierWork) -> DataFrame | None:
        ranges = [(t, p, s, e) for t, p, s, e in work.offsets if e > max(s, 0)]
        if not ranges:
            return None
        topic = self.table.topic
        starting = {topic: {str(p): s for _, p, s, _ in ranges}}
        ending = {topic: {str(p): e for _, p, _, e in ranges}}
        return (
            self.spark.read.format("kafka")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", json.dumps(starting))
            .option("endingOffsets", json.dumps(ending))
            .option("failOnDataLoss", "true")
            .load()
        )

    def process(self, work: BarrierWork) -> None:
        started = now_ms()
        raw = self.read_range(work)
        counts = (0, 0, 0)
        version = None
        if raw is not None:
            version, counts = self._ingest(raw, work)
        if version is None:
            version = self.sink.version_at(work.barrier, work.generation)
        self.publisher.publish(self.job_id, self.table.name, work.barrier, work.generation, version, started,
                               counts, offsets=work.offsets)

    def _ingest(self, raw: DataFrame, work: BarrierWork) -> tuple[int | None, tuple[int, int, int]]:
        schema = f"{self.table.schema_ddl}, {CORRUPT} STRING"
        parsed = raw.select(
            "key", "value", "topic", "partition", "offset", "timestamp",
            F.from_json(F.col("value").cast("string"), schema,
                        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}).alias("r"),
        ).cache()
        try:
            bad_condition = F.col("value").isNull() | F.col("r").isNull() | F.col(f"r.{CORRUPT}").isNotNull()
            for key in self.table.primary_key:
                bad_condition = bad_condition | F.col(f"r.{key}").isNull()
            bad_rows = parsed.where(bad_condition).select("key", "value", "topic", "partition", "offset").collect()
            good = parsed.where(~bad_condition)
            rows_in = parsed.count()
            columns = [c.name for c in self.table.columns]
            if self.table.primary_key:
                last = Window.partitionBy(*[F.col(f"r.{k}") for k in self.table.primary_key]).orderBy(
                    F.col("timestamp").desc(), F.col("partition").desc(), F.col("offset").desc()
                )
                good = good.withColumn("_rank", F.row_number().over(last)).where("_rank = 1")
            rows = good.select(*[F.col(f"r.{c}").alias(c) for c in columns])
            rows_out = rows.count()
            version = None
            if rows_out:
                version = self.sink.commit(work.barrier, work.generation, lambda: self._write(rows))
            if bad_rows:
                self._dead_letters(bad_rows, work)
            return version, (rows_in, rows_out, len(bad_rows))
        finally:
            parsed.unpersist()

    def _write(self, rows: DataFrame) -> None:
        if not self.table.primary_key:
            rows.write.format("delta").mode("append").save(self.sink.path)
            return
        from delta.tables import DeltaTable

        condition = " AND ".join(f"t.`{k}` = s.`{k}`" for k in self.table.primary_key)
        (
            DeltaTable.forPath(self.spark, self.sink.path).alias("t")
            .merge(rows.alias("s"), condition)
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    def _dead_letters(self, bad_rows: list[Any], work: BarrierWork) -> None:
        records = [
            (r["key"], r["value"], r["topic"], r["partition"], r["offset"], dlq_reason(r["value"], self.table), work.barrier)
            for r in bad_rows
        ]
        frame = self.spark.createDataFrame(records, DLQ_SCHEMA)
        self.dlq.commit(work.barrier, work.generation, lambda: frame.write.format("delta").mode("append").save(self.dlq.path))
