"""Root ingestion: barrier ``b`` reads exactly ``[cut(b-1), cut(b))`` of the table's topic.

Records are decoded by the table's format (``spark_jobs.runtime.formats``). Records that cannot be
decoded or do not fit the table go to ``<table>__dlq`` with the raw bytes, topic, partition,
offset and the reason; they are counted in the completion, never dropped. Append-only tables
append; tables with a primary key MERGE (upserts and deletes), the last change per key inside
the barrier winning: the newest offset within a partition, and across partitions (a key that
moved) the newest record timestamp.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyspark.sql import DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F

from coordinator.client.clock import now_ms
from coordinator.domain.events import dead_letters
from coordinator.domain.starts import departures
from coordinator.domain.work import EMPTY, BarrierWork
from coordinator.settings import CrashAt
from spark_jobs.planning.pipeline import RootTable
from spark_jobs.runtime.commits import CompletionPublisher, DeltaSink, merge_by_key
from spark_jobs.runtime.formats import CONFLUENT, DELETING, check_avro_schema, decode, reason
from spark_jobs.runtime.kafka_ranges import read_ranges
from spark_jobs.runtime.schema_registry import RegistryUnavailable, SchemaRegistry
from spark_jobs.runtime.source_transactions import TransactionAlignment
from spark_jobs.runtime.stopwatch import Stopwatch

log = logging.getLogger(__name__)
DLQ_SCHEMA = "raw_key BINARY, raw_value BINARY, topic STRING, `partition` INT, `offset` BIGINT, error STRING, barrier BIGINT"


@dataclass
class RootIngestion:
    spark: SparkSession
    table: RootTable
    job_id: str
    locate: Callable[[str], str]  # table name -> its location (Settings.table_location)
    publisher: CompletionPublisher
    kafka_options: Mapping[str, str]  # kafka_ranges.kafka_source_options(settings)
    crash_at: CrashAt | None = None  # drills only (LOCKSTEP_CRASH_AT)
    compact_every: int = 0  # LOCKSTEP_COMPACT_EVERY (0: never)
    registry_url: str = ""  # LOCKSTEP_SCHEMA_REGISTRY_URL, for the Confluent formats
    table_id: str = ""  # the coordinator's id of the table (TableState.table_id): its commits carry it
    # where the table's start rule said its first barrier reads each partition from (TableState.start_offsets),
    # if the table had no exact point when the job started: its first barrier is checked against it
    start_offsets: Mapping[tuple[str, int], int] | None = None

    def __post_init__(self) -> None:
        self.schemas: dict[int, str] = {}  # writer schemas of the topic's subjects, as of the last barrier
        self.registry = SchemaRegistry(self.registry_url) if self.table.format in CONFLUENT else None
        self.alignment = (TransactionAlignment(self.spark, self.table, self.kafka_options, self.registry_url)
                          if self.table.transactions else None)
        if self.table.format == "avro":
            check_avro_schema(self.table)
        self.sink = DeltaSink(self.spark, self.locate(self.table.name), self.job_id, self.table.schema_ddl,
                              crash_at=self.crash_at, compact_every=self.compact_every, name=self.table.name,
                              table_id=self.table_id)
        self.dlq = DeltaSink(self.spark, self.locate(dead_letters(self.table.name)), dead_letters(self.job_id),
                             DLQ_SCHEMA, crash_at=self.crash_at, compact_every=self.compact_every,
                             name=dead_letters(self.table.name), lazy_history=True, table_id=self.table_id)

    def close(self) -> None:
        """The job's query stopped: finish its tables' upkeep (``DeltaSink.close``), let go of its producer."""
        self.sink.close()
        self.dlq.close()
        self.publisher.close()

    def process(self, work: BarrierWork) -> None:
        started = now_ms()
        watch = Stopwatch()
        if self.start_offsets is not None:
            self._check_start(work, self.start_offsets)
            self.start_offsets = None
        if work.restore_to is not None:
            with watch.phase("restore"):
                self._restore(work)
        offsets = work.offsets
        if self.registry is not None and any(r.end > max(r.start, 0) for r in offsets):
            with watch.phase("plan"):
                self.schemas = self._writer_schemas(self.registry)
        if self.alignment is not None:
            with watch.phase("align"):
                offsets = self.alignment.align(work, self.schemas)
        with watch.phase("plan"):
            raw = read_ranges(self.spark, self.kafka_options, self.table.topic, offsets)
        counts = (0, 0, 0)
        version = None
        if raw is not None:
            version, counts = self._ingest(raw, work, watch)
        if version is None:
            version = self.sink.version_at(work.barrier, work.generation)
        self.publisher.publish(self.job_id, self.table.name, work.barrier, work.generation, version, started,
                               counts, offsets=offsets, phases=watch.phases())
        if self.alignment is not None:
            self.alignment.committed(work, offsets)

    def _check_start(self, work: BarrierWork, starts: Mapping[tuple[str, int], int]) -> None:
        """Say loudly, once, if the table's first barrier does not begin where its start rule
        resolved to: records would be missing from the table, or read that the rule leaves out."""
        for departure in departures(work.offsets, dict(starts)):
            log.error("table %s: its first barrier %d departs from its start rule (%s): %s. Please report it; "
                      "`lockstep revise %s --full` reads the topic again from the start rule", self.table.name,
                      work.barrier, self.table.start, departure, self.table.name)

    def _restore(self, work: BarrierWork) -> None:
        """Revised: put the table back to its exact point at the revision's barrier (and the dead
        letters to their newest commit at or before it), so re-ingesting from there adds no copies."""
        assert work.restore_to is not None
        barrier, version = work.restore_to
        self.sink.restore(barrier, work.generation, None if version == EMPTY else version)
        self.dlq.ensure_history()
        dead = max((v for (g, b), v in self.dlq.versions.items() if b <= barrier and g < work.generation), default=None)
        self.dlq.restore(barrier, work.generation, None if version == EMPTY else dead)

    def _ingest(self, raw: DataFrame, work: BarrierWork, watch: Stopwatch) -> tuple[int | None, tuple[int, int, int]]:
        """One Spark job decodes the barrier's records and writes the good ones; the counts the
        completion carries are observed on the way. The raw records of the rejected ones (rare)
        are read again and written as dead letters."""
        with watch.phase("plan"):
            rows, decoded, observation = self._decoded(raw, work)
        version = self.sink.commit(work.barrier, work.generation, lambda: self._write(rows), watch=watch)
        if self.sink.written:
            totals = observation.get
        else:  # committed before a restart: the write did not run, so count again (rare)
            totals = decoded.agg(F.count(F.lit(1)).alias("rows"), F.sum(F.col("is_bad").cast("int")).alias("bad")).first()
        rows_in, rejected = int(totals["rows"]), int(totals["bad"] or 0)
        if rejected:
            with watch.phase("dead_letters"):
                self._dead_letters(self._decode(raw).where("is_bad"), work)
        return version, (rows_in, rows_in - rejected, rejected)

    def _decoded(self, raw: DataFrame, work: BarrierWork) -> tuple[DataFrame, DataFrame, Observation]:
        """The rows to write (the last change per key for a keyed table), the decoded records,
        and the observation that counts them (and the rejected ones) during the write."""
        observation = Observation(f"ingest_{self.job_id}_{work.generation}_{work.barrier}_{uuid.uuid4().hex[:6]}")
        decoded = self._decode(raw).observe(
            observation, F.count(F.lit(1)).alias("rows"), F.sum(F.col("is_bad").cast("int")).alias("bad"))
        good = decoded.where(~F.col("is_bad"))
        if self.table.primary_key:
            keys = [F.col(f"row.{k}") for k in self.table.primary_key]
            newest_in_partition = Window.partitionBy(*keys, "partition").orderBy(F.col("offset").desc())
            newest = Window.partitionBy(*keys).orderBy(F.col("timestamp").desc(), F.col("partition").desc())
            # one shuffle by key serves both windows (hash(key) also clusters (key, partition))
            good = (good.repartition(*keys)
                    .withColumn("_rank", F.row_number().over(newest_in_partition)).where("_rank = 1")
                    .withColumn("_rank", F.row_number().over(newest)).where("_rank = 1"))
        return good.select("row.*", "is_delete"), decoded, observation

    def _decode(self, raw: DataFrame) -> DataFrame:
        return decode(raw, self.table, self.schemas, self.registry_url)

    def _writer_schemas(self, registry: SchemaRegistry) -> dict[int, str]:
        """The schemas registered for the topics' values and the table's keys; while the registry
        does not answer, the barrier waits (and says so) rather than rejecting records it cannot read."""
        waited = 0.0
        while True:
            try:
                subjects = [f"{topic}-value" for topic in self.table.topics] + [f"{self.table.topic}-key"]
                return {i: schema for subject in subjects for i, schema in registry.subject(subject).items()}
            except RegistryUnavailable as exc:
                pause = min(30.0, max(1.0, waited))
                log.warning("table %s waits for the schema registry (%.0f s so far, next try in %.0f s): %s",
                            self.table.name, waited, pause, exc)
                time.sleep(pause)
                waited += pause

    def _write(self, rows: DataFrame) -> None:
        columns = [c.name for c in self.table.columns]
        if not self.table.primary_key:
            self.sink.append(rows.select(*columns))
            return
        delete_flag = "is_delete" if self.table.format in DELETING else None
        merge_by_key(self.spark, self.sink.path, rows, self.table.primary_key, columns, delete_flag)

    def _dead_letters(self, bad: DataFrame, work: BarrierWork) -> None:
        """Write the rejected records with why each was rejected; the reasons are found on the
        executors, so a barrier of garbage never passes through the driver."""
        table = self.table
        schemas, registry_url = dict(self.schemas), self.registry_url
        why = F.udf(lambda key, value: reason(table, key, value, schemas, registry_url), "string")
        frame = bad.select(F.col("key").alias("raw_key"), F.col("value").alias("raw_value"), "topic", "partition",
                           "offset", why("key", "value").alias("error"), F.lit(work.barrier).cast("bigint").alias("barrier"))
        self.dlq.commit(work.barrier, work.generation, lambda: self.dlq.append(frame))
