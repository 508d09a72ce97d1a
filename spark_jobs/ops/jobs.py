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
from coordinator.client.offsets import EndOffsets
from coordinator.client.starts import resolve_start
from coordinator.client.state import read_state
from coordinator.domain import Command, DeclareTable, MetaState, RegisterJob
from coordinator.domain.errors import ForeignState, Rejected
from coordinator.domain.events import CutEntry, TableKind, TableState
from coordinator.domain.starts import begin_offsets
from coordinator.domain.work import BarrierWork
from coordinator.settings import Settings
from spark_jobs.ops.tables import checkpoint_location
from spark_jobs.planning.pipeline import Job, Pipeline, RootTable
from spark_jobs.planning.plans import plan_for
from spark_jobs.runtime.commits import CompletionPublisher
from spark_jobs.runtime.epochs import TRIGGER_MS, register_barrier_source, settings_options
from spark_jobs.runtime.ingest import RootIngestion
from spark_jobs.runtime.ivm import TableMaintainer
from spark_jobs.runtime.kafka_ranges import kafka_source_options
from spark_jobs.runtime.storage import Storage


def register_pipeline(settings: Settings, pipeline: Pipeline, timeout: float = 30.0) -> Pipeline:
    """Declare every table and register every job; the first rejection raises Rejected.

    Returns the pipeline to run: without the ``CREATE TABLE IF NOT EXISTS ... AS SELECT``
    statements whose table already exists and is not theirs (those do nothing). Each root's start
    rule is resolved to offsets here; the coordinator keeps those of a table's first declaration."""
    starts = _resolve_starts(settings, pipeline.roots)
    skip = _existing_elsewhere(settings, pipeline)
    pipeline = pipeline.without(skip)
    commands: list[Command] = [
        DeclareTable(new_request_id(), t.name, TableKind.ROOT, t.primary_key, t.schema_ddl, start=t.start,
                     start_offsets=starts[t.name]) for t in pipeline.roots
    ] + [DeclareTable(new_request_id(), t.name, TableKind.INTERMEDIATE, ctas=True) for t in pipeline.derived if t.declared_here]
    commands += [RegisterJob(new_request_id(), j.job_id, j.sink, j.sources, j.external_topics, j.sql) for j in pipeline.jobs]
    for command in commands:
        outcome = emit(settings, command, timeout)
        if not outcome.accepted:
            raise Rejected(f"{outcome.command} {getattr(command, 'name', getattr(command, 'job_id', ''))}: {outcome.reason}")
    return pipeline


def _resolve_starts(settings: Settings, roots: Sequence[RootTable]) -> dict[str, tuple[CutEntry, ...]]:
    """Each root table's start rule as offsets of its topics now (``coordinator.client.starts``)."""
    if not roots:
        return {}
    offsets = EndOffsets(settings)
    try:
        return {t.name: resolve_start(offsets, t.topics, t.start) for t in roots}
    finally:
        offsets.close()


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


def job_processor(spark: SparkSession, pipeline: Pipeline, job: Job, settings: Settings,
                  state: MetaState | None = None) -> RootIngestion | TableMaintainer:
    """What processes ``job``'s barriers, in a session of its own: the per-barrier Delta txn
    settings are session SQL confs, and jobs run concurrently. ``state``: the coordinator's, as
    read lately (read here if not given), for the table's id and start rule. A table whose
    folder is not the one the coordinator knows is refused (``check_table_home``, ``DeltaSink``)."""
    record = declared_table(settings, job, state)
    check_table_home(spark, settings, job, record)
    session = spark.newSession()
    publisher = CompletionPublisher(settings)
    table = pipeline.table(job.sink)
    try:
        if isinstance(table, RootTable):
            fresh = record.latest_exact is None
            return RootIngestion(session, table, job.job_id, settings.table_location, publisher,
                                 kafka_source_options(settings), crash_at=settings.crash_at,
                                 compact_every=settings.compact_every, registry_url=settings.schema_registry_url,
                                 table_id=record.table.table_id,
                                 start_offsets=begin_offsets(record.table) if fresh else None)
        return TableMaintainer(session, table, plan_for(pipeline, table), job.job_id, settings.table_location,
                               publisher, crash_at=settings.crash_at, compact_every=settings.compact_every,
                               table_id=record.table.table_id)
    except BaseException:  # e.g. a table Delta refuses to create: no producer left behind
        publisher.close()
        raise


@dataclass(frozen=True)
class DeclaredTable:
    """A job's table as the coordinator knows it: its record, and its newest exact point."""

    table: TableState
    latest_exact: int | None


def declared_table(settings: Settings, job: Job, state: MetaState | None = None) -> DeclaredTable:
    """``job``'s table as the coordinator knows it, or an error that says how to declare it."""
    state = state if state is not None else read_state(settings)
    record = state.tables.get(job.sink)
    if record is None:
        raise Rejected(f"table {job.sink!r} of job {job.job_id!r} is not declared with the coordinator at "
                       f"{settings.bootstrap} (prefix {settings.topic_prefix!r}): run its pipeline with `lockstep run`")
    return DeclaredTable(record, state.latest_exact(job.sink))


def check_table_home(spark: SparkSession, settings: Settings, job: Job, record: DeclaredTable) -> None:
    """Refuse a table the coordinator holds exact points of whose folder holds no Delta table: the
    warehouse changed (LOCKSTEP_WAREHOUSE) or the folder was deleted outside `lockstep drop`;
    writing there would start the table over while readers still trust its exact points."""
    location = settings.table_location(job.sink)
    if record.latest_exact is not None and not Storage(spark).exists(f"{location}/_delta_log"):
        raise ForeignState(
            f"table {job.sink!r} has exact points up to barrier {record.latest_exact} with the coordinator, but "
            f"{location} holds no Delta table: LOCKSTEP_WAREHOUSE changed, or its folder was deleted outside "
            f"`lockstep drop`. Set LOCKSTEP_WAREHOUSE back; or `lockstep drop {job.sink}` and run the pipeline "
            "again to start it over")


def start_job(spark: SparkSession, pipeline: Pipeline, job: Job, settings: Settings,
              on_barrier: Callable[[BarrierWork], None] | None = None, drain_flag: Path | None = None,
              state: MetaState | None = None) -> JobRun:
    """Start one job as its own streaming query (its processor: ``job_processor``). Once the
    file ``drain_flag`` exists the job is offered no new barrier (``Supervisor.stop``).
    ``state``: the coordinator's, as read lately (read here if not given)."""
    state = state if state is not None else read_state(settings)
    register_barrier_source(spark)
    processor = job_processor(spark, pipeline, job, settings, state)
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
    query = (
        barriers.writeStream.queryName(job.job_id)
        .foreachBatch(batch)
        .option("checkpointLocation", checkpoint_location(settings, job.job_id, declared_table(settings, job, state).table))
        .trigger(processingTime=f"{TRIGGER_MS} milliseconds")
        .start()
    )
    return JobRun(query, processor)


def select_jobs(pipeline: Pipeline, only: Sequence[str] = ()) -> list[Job]:
    """The pipeline's jobs, or those named (by job id or sink table) in ``only``."""
    return [j for j in pipeline.jobs if not only or j.job_id in only or j.sink in only]


def start_jobs(spark: SparkSession, pipeline: Pipeline, settings: Settings, only: Sequence[str] = ()) -> list[JobRun]:
    state = read_state(settings)
    return [start_job(spark, pipeline, job, settings, state=state) for job in select_jobs(pipeline, only)]
