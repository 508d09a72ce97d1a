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

from coordinator.client.commands import emit, new_request_id
from coordinator.client.state import StateReader, read_state
from coordinator.client.topics import Topics
from coordinator.domain import Command, DeclareTable, DeregisterJob, JobState, RegisterJob, RenewJob
from coordinator.domain.errors import Rejected
from coordinator.domain.events import END_STATUSES, JobStatus, TableKind
from coordinator.domain.state import MetaState
from coordinator.domain.work import BarrierWork
from coordinator.settings import Settings
from spark_jobs.ops.ctas_cleanup import CtasCleanup
from spark_jobs.ops.hooks import JobEvent, JobHooks
from spark_jobs.ops.openlineage_events import OpenLineageEvents
from spark_jobs.ops.upkeep import TableUpkeep
from spark_jobs.planning.pipeline import Job, Pipeline, RootTable
from spark_jobs.planning.plans import plan_for
from spark_jobs.runtime.commits import CompletionPublisher
from spark_jobs.runtime.epochs import TRIGGER_MS, register_barrier_source, settings_options
from spark_jobs.runtime.ingest import RootIngestion, kafka_source_options
from spark_jobs.runtime.ivm import TableMaintainer
from spark_jobs.runtime.job_metrics import job_metrics
from spark_jobs.runtime.storage import Storage


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


def start_job(spark: SparkSession, pipeline: Pipeline, job: Job, settings: Settings,
              on_barrier: Callable[[BarrierWork], None] | None = None) -> StreamingQuery:
    """Start one job as its own streaming query. Its writes use a session of their own, since
    the per-barrier Delta txn settings are session SQL confs and jobs run concurrently."""
    register_barrier_source(spark)
    session = spark.newSession()
    publisher = CompletionPublisher(settings)
    table = pipeline.table(job.sink)
    if isinstance(table, RootTable):
        processor = RootIngestion(session, table, job.job_id, settings.table_location, publisher,
                                  kafka_source_options(settings), crash_at=settings.crash_at,
                                  compact_every=settings.compact_every)
    else:
        processor = TableMaintainer(session, table, plan_for(pipeline, table), job.job_id, settings.table_location,
                                    publisher, crash_at=settings.crash_at, compact_every=settings.compact_every)

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
        .load()
    )
    checkpoint = settings.checkpoints / job.job_id
    return (
        barriers.writeStream.queryName(job.job_id)
        .foreachBatch(batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=f"{TRIGGER_MS} milliseconds")
        .start()
    )


def select_jobs(pipeline: Pipeline, only: Sequence[str] = ()) -> list[Job]:
    """The pipeline's jobs, or those named (by job id or sink table) in ``only``."""
    return [j for j in pipeline.jobs if not only or j.job_id in only or j.sink in only]


def start_jobs(spark: SparkSession, pipeline: Pipeline, settings: Settings,
               only: Sequence[str] = ()) -> list[StreamingQuery]:
    return [start_job(spark, pipeline, job, settings) for job in select_jobs(pipeline, only)]


CATCHING_UP = 10  # barriers behind the newest before `lockstep run` reports a job's progress
PROGRESS_EVERY_S = 5.0


def barriers_behind(state: MetaState, job_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
    """job id -> (the newest barrier its table holds, or where the job started; how many barriers
    were announced after it)."""
    last, out = state.last_barrier(), {}
    for job_id in job_ids:
        if (job := state.jobs.get(job_id)) is not None:
            done = state.done_through(job)
            out[job_id] = (done, max(0, last - done))
    return out


@dataclass
class Supervisor:
    """Keeps a pipeline's jobs running: a job that fails is reported and restarted after a
    backoff (1 s, 2 s, 4 s ... at most ``max_backoff``) while the others carry on; the restarted
    job catches up from its checkpoint and its table's Delta history. With ``follow_status``
    (``lockstep run``), a job that ``lockstep stop`` ended is stopped here (FINISHED: after the
    barrier in progress; CANCELED or FAILED: at once) and not restarted. With ``max_restarts``, a
    job that fails once more than that is given up and recorded FAILED; and while a job is more than
    ``CATCHING_UP`` barriers behind (a restart after a while), a progress line every
    ``PROGRESS_EVERY_S`` says where each stands and how long it may take. ``hooks`` hear of every
    start and end (``spark_jobs.ops.hooks``); the CTAS cleanup (``spark_jobs.ops.ctas_cleanup``)
    always listens. The jobs' tables are vacuumed every ``LOCKSTEP_VACUUM_EVERY_S`` (``upkeep``).
    A job whose CTAS table is still pending (no first commit yet) is renewed (``RenewJob``) when it
    starts and every third of the liveness window, so the leader knows this runner is alive
    however long that first commit takes (it drops a pending table whose runner went silent).

    Example::

        supervisor = Supervisor(spark, pipeline, settings, report=print)
        supervisor.start()
        supervisor.run(stop)  # until ``stop`` (a threading.Event) is set or every job ended
    """

    spark: SparkSession
    pipeline: Pipeline
    settings: Settings
    only: Sequence[str] = ()
    report: Callable[[str], None] = lambda message: None
    max_backoff: float = 60.0
    hooks: Sequence[JobHooks] = ()
    follow_status: bool = False  # stop jobs `lockstep stop` ended (reads their status once a second)
    finish_timeout: float = 120.0  # longest wait for the barrier in progress of a FINISHED job
    max_restarts: int | None = None  # None: restart a failing job forever
    queries: dict[str, StreamingQuery] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    ended: dict[str, str] = field(default_factory=dict)  # job id -> status, for jobs stopped here
    _retry_at: dict[str, float] = field(default_factory=dict)
    _status_reader: StateReader | None = None
    _status_read_at: float = 0.0
    _renewed_at: float = 0.0
    _progress_at: float = 0.0
    _lagging: dict[str, tuple[float, int]] = field(default_factory=dict)  # job -> (when, behind) last said
    _upkeep: TableUpkeep | None = None

    def __post_init__(self) -> None:
        lineage = [OpenLineageEvents(self.settings, self.pipeline)] if self.settings.openlineage else []
        self.hooks = [CtasCleanup(Storage(self.spark), self.settings, self.report), *lineage, *self.hooks]

    def start(self) -> None:
        jobs = select_jobs(self.pipeline, self.only)
        self._upkeep = TableUpkeep(self.spark, self.settings, [j.sink for j in jobs], self.report).start()
        self._renew([j.job_id for j in jobs])  # a restarted runner's jobs: registering them again was a no-op
        for job in jobs:
            self.queries[job.job_id] = self._start_job(job)
            self._tell("on_created", JobEvent(job.job_id, job.sink, JobStatus.RUNNING))

    def _start_job(self, job: Job) -> StreamingQuery:
        """Start ``job``; say how long its setup took and, once, when its first barrier is in (a
        restart's recovery time, where a user sees it)."""
        began = time.monotonic()
        setup: list[float] = []  # seconds, once start_job returned
        first: list[BarrierWork] = []

        def committed(work: BarrierWork) -> None:
            if not first:
                first.append(work)
                took = f" (setup {setup[0]:.1f} s)" if setup else ""
                self.report(f"job {job.job_id} committed barrier {work.barrier}, {time.monotonic() - began:.1f} s after "
                            f"it started{took}")

        query = start_job(self.spark, self.pipeline, job, self.settings, on_barrier=committed)
        setup.append(time.monotonic() - began)
        return query

    def poll(self) -> None:
        """Stop jobs that were ended, notice failed ones and restart those whose backoff has passed."""
        now = time.monotonic()
        for job in self._ended_jobs(now):
            self._end(job)
        self._renew_pending(now)
        for job_id, query in list(self.queries.items()):
            if query.isActive:
                continue
            job = next(j for j in self.pipeline.jobs if j.job_id == job_id)
            if job_id not in self._retry_at:
                error = query.exception()
                self.failures[job_id] = self.failures.get(job_id, 0) + 1
                first_line = str(error).splitlines()[0] if error else "stopped"
                if self.max_restarts is not None and self.failures[job_id] > self.max_restarts:
                    self._give_up(job, first_line)
                    continue
                delay = min(self.max_backoff, 2.0 ** (self.failures[job_id] - 1))
                self._retry_at[job_id] = now + delay
                self.report(f"job {job_id} failed (the others keep running); restart in {delay:.0f} s: {first_line}")
                job_metrics.restarts.labels(job_id).inc()
                self._tell("on_failed", JobEvent(job_id, job.sink, JobStatus.RUNNING, error=first_line))
            elif now >= self._retry_at[job_id]:
                del self._retry_at[job_id]
                try:
                    self.queries[job_id] = self._start_job(job)
                    self.report(f"job {job_id} restarted (attempt {self.failures[job_id] + 1})")
                except Exception as exc:  # noqa: BLE001 - a restart that fails is retried like a failure
                    self.report(f"job {job_id} could not restart: {exc}")
                    self._retry_at[job_id] = now + min(self.max_backoff, 2.0 ** self.failures[job_id])

    def _give_up(self, job: Job, error: str) -> None:
        """Record a job that failed more than ``max_restarts`` times as FAILED and let it be."""
        del self.queries[job.job_id]
        self.ended[job.job_id] = JobStatus.FAILED
        reason = f"failed {self.failures[job.job_id]} time(s): {error}"[:500]
        try:
            outcome = emit(self.settings, DeregisterJob(new_request_id(), job.job_id, JobStatus.FAILED, reason))
            if not outcome.accepted:
                self.report(f"could not record job {job.job_id} as FAILED: {outcome.reason}")
        except Exception as exc:  # noqa: BLE001 - the job stays stopped here either way
            self.report(f"could not record job {job.job_id} as FAILED: {exc}")
        self.report(f"job {job.job_id} gave up after {self.failures[job.job_id]} failure(s) (FAILED): {error}")
        self._tell("on_failed", JobEvent(job.job_id, job.sink, JobStatus.FAILED, reason, error))

    def _ended_jobs(self, now: float) -> list[JobState]:
        """This process's jobs the coordinator records as ended (read at most once a second)."""
        if not self.follow_status or now - self._status_read_at < 1.0 or not self.queries:
            return []
        self._status_read_at = now
        state = self._read_state("job statuses")
        if state is None:
            return []
        self._report_progress(state, now)
        return [j for job_id in self.queries if (j := state.jobs.get(job_id)) is not None and j.status in END_STATUSES]

    def _report_progress(self, state: MetaState, now: float) -> None:
        """A progress line for the jobs far behind (every ``PROGRESS_EVERY_S``), and one when all caught up."""
        lagging = {j: gap for j, gap in barriers_behind(state, list(self.queries)).items() if gap[1] > CATCHING_UP}
        if not lagging:
            if self._lagging:
                self._lagging.clear()
                self.report(f"caught up: every job is within {CATCHING_UP} barriers of the newest, {state.last_barrier()}")
            return
        if now - self._progress_at < PROGRESS_EVERY_S:
            return
        self._progress_at = now
        parts = []
        for job_id, (done, behind) in sorted(lagging.items()):
            before = self._lagging.get(job_id)
            pace = ""
            if before is not None and before[1] > behind:  # closing in: at this pace, how long
                pace = f", ~{behind * (now - before[0]) / (before[1] - behind):.0f} s to go"
            parts.append(f"{job_id} at barrier {done}, {behind} behind{pace}")
            self._lagging[job_id] = (now, behind)
        self.report(f"catching up to barrier {state.last_barrier()}: {'; '.join(parts)}")

    def _renew_pending(self, now: float) -> None:
        """Every third of the liveness window, renew this runner's running jobs whose table is
        still pending (see the class)."""
        if now - self._renewed_at >= self.settings.barriers.liveness_ms / 3000 and self.queries:
            self._renewed_at = now
            self._renew(list(self.queries))

    def _renew(self, job_ids: list[str]) -> None:
        """Send ``RenewJob`` for those of ``job_ids`` whose table is still pending."""
        state = self._read_state("pending tables")
        pending = set(state.pending()) if state is not None else set()
        timeout = max(self.settings.barriers.liveness_ms / 3000, 1.0)
        for job in self.pipeline.jobs:
            if job.job_id not in job_ids or job.sink not in pending:
                continue
            try:
                outcome = emit(self.settings, RenewJob(new_request_id(), job.job_id), timeout=timeout)
                if not outcome.accepted:
                    self.report(f"could not renew job {job.job_id}: {outcome.reason}")
            except Exception as exc:  # noqa: BLE001 - renewed again next time; the job keeps running
                self.report(f"could not renew job {job.job_id}: {exc}")

    def _read_state(self, what: str) -> MetaState | None:
        """The coordinator's state as of now, or None (reported) if it cannot be read."""
        try:
            if self._status_reader is None:
                self._status_reader = StateReader(self.settings, Topics(self.settings.topic_prefix))
            return self._status_reader.read_to_end(timeout=10)
        except Exception as exc:  # noqa: BLE001 - the jobs keep running; the state is read again next time
            self.report(f"could not read {what} from {self.settings.bootstrap}: {exc}")
            return None

    def _end(self, job: JobState) -> None:
        query = self.queries.pop(job.job_id)
        self._retry_at.pop(job.job_id, None)
        if job.status == JobStatus.FINISHED:  # no new barrier is offered to it; let the one in progress commit
            deadline = time.monotonic() + self.finish_timeout
            while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
                time.sleep(0.2)
        query.stop()
        self.ended[job.job_id] = job.status
        why = f": {job.reason}" if job.reason else ""
        self.report(f"job {job.job_id} stopped ({job.status}{why})")
        hook = {JobStatus.FINISHED: "on_finished", JobStatus.CANCELED: "on_canceled"}.get(job.status, "on_failed")
        self._tell(hook, JobEvent(job.job_id, job.sink, job.status, job.reason))

    def _tell(self, hook: str, event: JobEvent) -> None:
        for hooks in self.hooks:
            try:
                getattr(hooks, hook)(event)
            except Exception as exc:  # noqa: BLE001 - a broken hook must not stop the job or the other hooks
                self.report(f"hook {type(hooks).__name__}.{hook} failed for job {event.job_id}: {exc}")

    def run(self, stop: threading.Event, every: float = 1.0) -> None:
        """Poll until ``stop`` is set or no job is left (all ended)."""
        while self.queries and not stop.wait(every):
            self.poll()

    def stop(self) -> None:
        if self._upkeep is not None:
            self._upkeep.close()
        for query in self.queries.values():
            query.stop()
        if self._status_reader is not None:
            self._status_reader.close()
            self._status_reader = None
