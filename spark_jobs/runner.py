"""Register a pipeline with the coordinator and run its jobs as barrier-driven streaming queries.

Example::

    pipeline = load_pipeline(Path("pipelines/shopping.sql"))
    register_pipeline(settings, pipeline)          # raises Rejected: nothing is started then
    queries = start_jobs(spark, pipeline, settings)  # one streaming query per job
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from coordinator.client import emit, new_request_id
from coordinator.domain import CommandOutcome, DeclareTable, RegisterJob
from coordinator.domain.errors import Rejected
from coordinator.settings import Settings
from spark_jobs.commits import CompletionPublisher
from spark_jobs.epochs import BarrierWork, register_barrier_source, settings_options
from spark_jobs.ingest import RootIngestion
from spark_jobs.ivm import TableMaintainer
from spark_jobs.pipeline import DerivedTable, Job, Pipeline, RootTable
from spark_jobs.plans import Plan, plan_query, shapes_of


def register_pipeline(settings: Settings, pipeline: Pipeline, timeout: float = 30.0) -> list[CommandOutcome]:
    """Declare every table and register every job; the first rejection raises Rejected."""
    commands = [
        DeclareTable(new_request_id(), t.name, "root", t.primary_key, t.schema_ddl) for t in pipeline.roots
    ] + [DeclareTable(new_request_id(), t.name, "intermediate") for t in pipeline.derived if t.declared_here]
    commands += [RegisterJob(new_request_id(), j.job_id, j.sink, j.sources, j.external_topics, j.sql) for j in pipeline.jobs]
    outcomes = []
    for command in commands:
        outcome = emit(settings, command, timeout)
        if not outcome.accepted:
            raise Rejected(f"{outcome.command} {getattr(command, 'name', getattr(command, 'job_id', ''))}: {outcome.reason}")
        outcomes.append(outcome)
    return outcomes


def start_job(spark: SparkSession, pipeline: Pipeline, job: Job, settings: Settings,
              on_barrier: Callable[[BarrierWork], None] | None = None) -> StreamingQuery:
    """Start one job as its own streaming query. Its writes use a session of their own, since
    the per-barrier Delta txn settings are session SQL confs and jobs run concurrently."""
    register_barrier_source(spark)
    session = spark.newSession()
    publisher = CompletionPublisher(settings)
    table = pipeline.table(job.sink)
    if isinstance(table, RootTable):
        processor = RootIngestion(session, table, job.job_id, settings.warehouse.absolute(), publisher, settings.bootstrap)
    else:
        processor = TableMaintainer(session, table, plan_for(pipeline, table), job.job_id, settings.warehouse.absolute(),
                                    publisher)

    def batch(frame: DataFrame, batch_id: int) -> None:
        for row in sorted(frame.collect(), key=lambda r: r["barrier"]):
            work = BarrierWork.from_row(row)
            processor.process(work)
            if on_barrier is not None:
                on_barrier(work)

    barriers = (
        spark.readStream.format("lockstep_barriers")
        .option("job_id", job.job_id)
        .options(**settings_options(settings))
        .load()
    )
    checkpoint = (settings.home / "checkpoints" / job.job_id).absolute()
    return (
        barriers.writeStream.queryName(job.job_id)
        .foreachBatch(batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
        .start()
    )


def plan_for(pipeline: Pipeline, table: DerivedTable) -> Plan:
    """The maintenance plan of a derived table, knowing the keys its sources promise."""
    shapes = shapes_of([(t.name, t.primary_key) for t in pipeline.roots], [(t.name, t.query) for t in pipeline.derived])
    return plan_query(table.query, shapes)


def explain_job(pipeline: Pipeline, job: Job) -> str:
    """How a job maintains its table, in one line (what `lockstep explain` prints)."""
    table = pipeline.table(job.sink)
    if isinstance(table, RootTable):
        how = f"upsert (MERGE) by key ({', '.join(table.primary_key)})" if table.primary_key else "append"
        return (f"root ingestion from Kafka topic {table.topic}, format {table.format}, {how}; "
                f"one Delta commit per barrier, bad records to {table.name}__dlq")
    return plan_for(pipeline, table).explain()


def select_jobs(pipeline: Pipeline, only: Sequence[str] = ()) -> list[Job]:
    """The pipeline's jobs, or those named (by job id or sink table) in ``only``."""
    return [j for j in pipeline.jobs if not only or j.job_id in only or j.sink in only]


def start_jobs(spark: SparkSession, pipeline: Pipeline, settings: Settings,
               only: Sequence[str] = ()) -> list[StreamingQuery]:
    return [start_job(spark, pipeline, job, settings) for job in select_jobs(pipeline, only)]


@dataclass
class Supervisor:
    """Keeps a pipeline's jobs running: a job that fails is reported and restarted after a
    backoff (1 s, 2 s, 4 s ... at most ``max_backoff``) while the others carry on; the restarted
    job catches up from its checkpoint and its table's Delta history.

    Example::

        supervisor = Supervisor(spark, pipeline, settings, report=print)
        supervisor.start()
        supervisor.run(stop)  # until ``stop`` (a threading.Event) is set
    """

    spark: SparkSession
    pipeline: Pipeline
    settings: Settings
    only: Sequence[str] = ()
    report: Callable[[str], None] = lambda message: None
    max_backoff: float = 60.0
    queries: dict[str, StreamingQuery] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    _retry_at: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        for job in select_jobs(self.pipeline, self.only):
            self.queries[job.job_id] = start_job(self.spark, self.pipeline, job, self.settings)

    def poll(self) -> None:
        """Notice failed jobs and restart those whose backoff has passed."""
        now = time.monotonic()
        for job_id, query in list(self.queries.items()):
            if query.isActive:
                continue
            if job_id not in self._retry_at:
                error = query.exception()
                self.failures[job_id] = self.failures.get(job_id, 0) + 1
                delay = min(self.max_backoff, 2.0 ** (self.failures[job_id] - 1))
                self._retry_at[job_id] = now + delay
                self.report(f"job {job_id} failed (the others keep running); restart in {delay:.0f} s: "
                            f"{str(error).splitlines()[0] if error else 'stopped'}")
            elif now >= self._retry_at[job_id]:
                del self._retry_at[job_id]
                job = next(j for j in self.pipeline.jobs if j.job_id == job_id)
                try:
                    self.queries[job_id] = start_job(self.spark, self.pipeline, job, self.settings)
                    self.report(f"job {job_id} restarted (attempt {self.failures[job_id] + 1})")
                except Exception as exc:  # noqa: BLE001 - a restart that fails is retried like a failure
                    self.report(f"job {job_id} could not restart: {exc}")
                    self._retry_at[job_id] = now + min(self.max_backoff, 2.0 ** self.failures[job_id])

    def run(self, stop: threading.Event, every: float = 1.0) -> None:
        while not stop.wait(every):
            self.poll()

    def stop(self) -> None:
        for query in self.queries.values():
            query.stop()
