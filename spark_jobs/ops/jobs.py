"""Start a pipeline's jobs: declare its tables and register its jobs with the coordinator,
then run each job as a barrier-driven streaming query (``Supervisor`` in
``spark_jobs.ops.runner`` keeps them running).

Example::

    pipeline = register_pipeline(settings, load_pipeline(Path("pipelines/shopping.sql")))  # raises Rejected
    runs = start_jobs(spark, pipeline, settings)   # one streaming query per job
    ...
    for run in runs:
        run.query.stop()
        run.processor.close()                      # its table's upkeep and clients
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pyspark.sql import DataFrame, SparkSession

from coordinator.client.commands import emit, new_request_id
from coordinator.client.state import read_state
from coordinator.domain import Command, DeclareTable, RegisterJob
from coordinator.domain.errors import Rejected
from coordinator.domain.events import TableKind
from coordinator.domain.work import BarrierWork
from coordinator.settings import Settings
from spark_jobs.planning.pipeline import Job, Pipeline, RootTable
from spark_jobs.planning.plans import plan_for
from spark_jobs.runtime.commits import CompletionPublisher
from spark_jobs.runtime.epochs import TRIGGER_MS, register_barrier_source, settings_options
from spark_jobs.runtime.ingest import RootIngestion
from spark_jobs.runtime.ivm import TableMaintainer
from spark_jobs.runtime.kafka_ranges import kafka_source_options


def register_pipeline(settings: Settings, pipeline: Pipeline, timeout: float = 30.0) -> Pipeline:
    """Declare every table and register every job; the first rejection raises Rejected.

    Returns the pipeline to run: without the ``CREATE TABLE IF NOT EXISTS ... AS SELECT``
    statements whose table already exists and is not theirs (those do nothing)."""
    skip = _existing_elsewhere(settings, pipeline)
    pipeline = pipeline.without(skip)
    commands: list[Command] = [
        DeclareTable(new_request_id(), t.name, TableKind.ROOT, t.primary_key, t.schema_ddl) for t in pipeline.roots
    ] + [DeclareTable(new_request_id(), t.name, TableKind.INTERMEDIATE, ctas=True) for t in pipeline.derived if t.declared_here]
    commands += [RegisterJob(new_request_id(), j.job_id, j.sink, j.sources, j.external_topics, j.sql) for j in pipeline.jobs]
    for command in commands:
        outcome = emit(settings, command, timeout)
        if not outcome.accepted:
            raise Rejected(f"{outcome.command} {getattr(command, 'name', getattr(command, 'job_id', ''))}: {outcome.reason}")
    return pipeline


def _existing_elsewhere(settings: Settings, pipeline: Pipeline) -> set[str]:
    """IF NOT EXISTS tables that exist already, other than by this very statement (same job,
    same query: running the pipeline again runs it again)."""
    asked = [t for t in pipeline.derived if t.if_not_exists]
    if not asked:
        return set()
    state = read_state(settings)
    jobs = {j.sink: j for j in pipeline.jobs}

    def ours(table: str) -> bool:
        known = state.jobs.get(jobs[table].job_id)
        return known is not None and (known.sink, known.sql) == (table, jobs[table].sql)

    return {t.name for t in asked if t.name in state.tables and not ours(t.name)}


class JobQuery(Protocol):
    """What the Supervisor asks of a running job: a ``StreamingQuery``, or a ``FusedJob``."""

    @property
    def isActive(self) -> bool: ...  # noqa: N802 - StreamingQuery's name

    @property
    def status(self) -> dict[str, Any]: ...

    @property
    def runId(self) -> str: ...  # noqa: N802

    def exception(self) -> Any: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class JobRun:
    """A started job: its streaming query, and what processes its barriers (``close()`` it once
    the query stopped, so its table's upkeep ends too)."""

    query: JobQuery
    processor: RootIngestion | TableMaintainer


def job_processor(spark: SparkSession, pipeline: Pipeline, job: Job, settings: Settings) -> RootIngestion | TableMaintainer:
    """What processes ``job``'s barriers, in a session of its own: the per-barrier Delta txn
    settings are session SQL confs, and jobs run concurrently."""
    session = spark.newSession()
    publisher = CompletionPublisher(settings)
    table = pipeline.table(job.sink)
    try:
        if isinstance(table, RootTable):
            return RootIngestion(session, table, job.job_id, settings.table_location, publisher,
                                 kafka_source_options(settings), crash_at=settings.crash_at,
                                 compact_every=settings.compact_every, registry_url=settings.schema_registry_url)
        return TableMaintainer(session, table, plan_for(pipeline, table), job.job_id, settings.table_location,
                               publisher, crash_at=settings.crash_at, compact_every=settings.compact_every)
    except BaseException:  # e.g. a table Delta refuses to create: no producer left behind
        publisher.close()
        raise


def start_job(spark: SparkSession, pipeline: Pipeline, job: Job, settings: Settings,
              on_barrier: Callable[[BarrierWork], None] | None = None, drain_flag: Path | None = None) -> JobRun:
    """Start one job as its own streaming query (its processor: ``job_processor``). Once the
    file ``drain_flag`` exists the job is offered no new barrier (``Supervisor.stop``)."""
    register_barrier_source(spark)
    processor = job_processor(spark, pipeline, job, settings)
    session = processor.spark

    def batch(frame: DataFrame, batch_id: int) -> None:
        # Each job's Spark jobs go to a scheduler pool of its own: a small barrier of one job
        # does not queue behind the tasks of a big one (FAIR between pools, see session.py).
        session.sparkContext.setLocalProperty("spark.scheduler.pool", job.job_id)
        for row in sorted(frame.collect(), key=lambda r: r["barrier"]):
            work = BarrierWork.from_row(row)
            processor.process(work)
            if on_barrier is not None:
                on_barrier(work)

    barriers = (
        spark.readStream.format("lockstep_barriers")
        .option("job_id", job.job_id)
        .options(**settings_options(settings))
        .option("drain_flag", str(drain_flag or ""))
        .load()
    )
    checkpoint = settings.checkpoints / job.job_id
    query = (
        barriers.writeStream.queryName(job.job_id)
        .foreachBatch(batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=f"{TRIGGER_MS} milliseconds")
        .start()
    )
    return JobRun(query, processor)


def select_jobs(pipeline: Pipeline, only: Sequence[str] = ()) -> list[Job]:
    """The pipeline's jobs, or those named (by job id or sink table) in ``only``."""
    return [j for j in pipeline.jobs if not only or j.job_id in only or j.sink in only]


def start_jobs(spark: SparkSession, pipeline: Pipeline, settings: Settings, only: Sequence[str] = ()) -> list[JobRun]:
    return [start_job(spark, pipeline, job, settings) for job in select_jobs(pipeline, only)]
