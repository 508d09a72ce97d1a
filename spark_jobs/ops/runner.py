"""Keep a registered pipeline's jobs running (``Supervisor``): start each job, or its fused
group, restart what fails, report progress, end jobs that are deregistered, and drain them at
a stop. Starting one job is ``spark_jobs.ops.jobs``.

Example::

    pipeline = register_pipeline(settings, load_pipeline(Path("pipelines/shopping.sql")))
    supervisor = Supervisor(spark, pipeline, settings)
    supervisor.run(stop_event)                     # until stop_event is set; then supervisor.stop(STOP_DRAIN_S)
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

from coordinator.client.commands import emit, new_request_id
from coordinator.client.state import StateFollower, StateReader
from coordinator.client.topics import Topics
from coordinator.domain import DeregisterJob, JobState
from coordinator.domain.events import END_STATUSES, JobStatus
from coordinator.domain.state import MetaState
from coordinator.domain.strides import commit_point
from coordinator.domain.work import BarrierWork, ready_barrier
from coordinator.settings import Settings
from spark_jobs.ops.ctas_cleanup import CtasCleanup
from spark_jobs.ops.fused import FusedJob
from spark_jobs.ops.hooks import JobEvent, JobHooks
from spark_jobs.ops.jobs import JobQuery, JobRun, declared_table, job_processor, select_jobs, start_job
from spark_jobs.ops.openlineage_events import OpenLineageEvents
from spark_jobs.ops.renewals import Renewals
from spark_jobs.ops.tables import checkpoint_location
from spark_jobs.ops.upkeep import TableUpkeep
from spark_jobs.ops.watchdog import Watchdog
from spark_jobs.planning.fusion import fused_groups
from spark_jobs.planning.pipeline import Job, Pipeline
from spark_jobs.runtime.ingest import RootIngestion
from spark_jobs.runtime.ivm import TableMaintainer
from spark_jobs.runtime.job_metrics import job_metrics
from spark_jobs.runtime.session import driver_exit_code, jvm_exited_error, spark_error
from spark_jobs.runtime.storage import Storage


def _await_batch(query: JobQuery, deadline: float) -> None:
    """Wait until ``query``'s batch in progress ended (its barrier committed), or ``deadline``."""
    while time.monotonic() < deadline and query.isActive and query.status["isTriggerActive"]:
        time.sleep(0.1)


STOP_DRAIN_S = 20.0  # how long a stop lets each job's barrier in progress commit (Ctrl-C, SIGTERM)
CATCHING_UP = 10  # barriers behind the newest before `lockstep run` reports a job's progress
PROGRESS_EVERY_S = 5.0


def barriers_behind(state: MetaState, job_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
    """job id -> (the newest barrier its table holds, or where the job started; how many barriers
    were announced after it, up to the newest its table commits: a strided table is not behind
    for the barriers it folds into its next multiple)."""
    last, out = state.last_barrier(), {}
    for job_id in job_ids:
        if (job := state.jobs.get(job_id)) is not None:
            done = state.done_through(job)
            out[job_id] = (done, commit_point(state, job.sink, last, floor=done) - done)
    return out


@dataclass
class Supervisor:
    """Keeps a pipeline's jobs running, each as its own streaming query or, with
    ``LOCKSTEP_FUSE_JOBS`` (the default), the jobs that read only tables of this run as members of
    their root job's fused group (``spark_jobs.ops.fused``; ``fused`` maps each to its group's
    leader). A job that fails is reported and restarted after a
    backoff (1 s, 2 s, 4 s ... at most ``max_backoff``) while the others carry on; the restarted
    job catches up from its checkpoint and its table's Delta history. With ``follow_status``
    (``lockstep run``), a job that ``lockstep stop`` ended is stopped here (FINISHED: after the
    barrier in progress; CANCELED or FAILED: at once) and not restarted. With ``max_restarts``, a
    job that fails once more than that is given up and recorded FAILED; and while a job is more than
    ``CATCHING_UP`` barriers behind (a restart after a while), a progress line every
    ``PROGRESS_EVERY_S`` says where each stands and how long it may take. ``hooks`` hear of every
    start and end (``spark_jobs.ops.hooks``); the CTAS cleanup (``spark_jobs.ops.ctas_cleanup``)
    always listens. The jobs' tables are vacuumed every ``LOCKSTEP_VACUUM_EVERY_S`` (``upkeep``).
    A job whose CTAS table is still pending (no first commit yet) is renewed (``spark_jobs.ops.
    renewals``; ``lockstep run`` starts them as soon as it registered the pipeline), so the leader
    knows this runner is alive however long that first commit takes. A job with a barrier ready
    for it whose table and Spark work stand still for ``LOCKSTEP_STUCK_AFTER_S`` is stopped and
    restarted like a failed one (``spark_jobs.ops.watchdog``). ``stop(drain_s)`` lets each job's
    barrier in progress commit (no new one is offered) before it stops the queries, so no Spark
    job is cut off in the middle.

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
    renewals: Renewals | None = None  # started at registration (lockstep run); else by start()
    queries: dict[str, JobQuery] = field(default_factory=dict)
    fused: dict[str, str] = field(default_factory=dict)  # member job id -> its group's leader (``fused``)
    failures: dict[str, int] = field(default_factory=dict)
    ended: dict[str, str] = field(default_factory=dict)  # job id -> status, for jobs stopped here
    _retry_at: dict[str, float] = field(default_factory=dict)
    _status_reader: StateReader | None = None
    _watchdog: Watchdog = field(init=False)
    _stuck: dict[str, str] = field(default_factory=dict)  # job -> why the watchdog stopped it
    _processors: dict[str, RootIngestion | TableMaintainer] = field(default_factory=dict)
    _status_read_at: float = 0.0
    _progress_at: float = 0.0
    _lagging: dict[str, tuple[float, int]] = field(default_factory=dict)  # job -> (when, behind) last said
    _upkeep: TableUpkeep | None = None
    _drain_flag: Path = field(init=False)
    _follower: StateFollower | None = None  # the state the fused members follow

    def __post_init__(self) -> None:
        lineage = [OpenLineageEvents(self.settings, self.pipeline)] if self.settings.openlineage else []
        self.hooks = [CtasCleanup(Storage(self.spark), self.settings, self.report), *lineage, *self.hooks]
        self._drain_flag = self.settings.home / "run" / f"drain-{uuid.uuid4().hex}"  # this runner's own
        self._watchdog = Watchdog(self.settings.stuck_after_s)

    def start(self) -> None:
        jobs = select_jobs(self.pipeline, self.only)
        if self.renewals is None:
            self.renewals = Renewals(self.settings, [j.job_id for j in jobs], self.report).start()
        self._upkeep = TableUpkeep(self.spark, self.settings, [j.sink for j in jobs], self.report).start()
        if self.settings.fuse_jobs:
            for leader, members in fused_groups(jobs).items():
                self.fused.update(dict.fromkeys(members, leader))
                self.report(f"fused group of {leader}: {', '.join(members)} run on its commits (no query of their own)")
        # where the jobs stand before they start: a job far behind is reported from its first
        # barrier on, even if it catches up before the first poll reads the state again
        # (and each job's table as the coordinator knows it: its id, its start, its exact points)
        before = self._read_state("the jobs' state")
        try:
            for job in jobs:
                self.queries[job.job_id] = self._start_job(job, before)
                self._tell("on_created", JobEvent(job.job_id, job.sink, JobStatus.RUNNING))
        except BaseException:  # e.g. a table refused (ForeignState): stop those started, say why
            self.stop()
            raise
        if before is not None and self.follow_status:
            self._report_progress(before, time.monotonic())

    def _start_job(self, job: Job, state: MetaState | None = None) -> JobQuery:
        """Start ``job``; say how long its setup took and, once, when its first barrier is in (a
        restart's recovery time, where a user sees it). ``state``: the coordinator's, read lately
        (read anew if None)."""
        began = time.monotonic()
        setup: list[float] = []  # seconds, once start_job returned
        first: list[BarrierWork] = []

        def committed(work: BarrierWork) -> None:
            if not first:
                first.append(work)
                took = f" (setup {setup[0]:.1f} s)" if setup else ""
                self.report(f"job {job.job_id} committed barrier {work.barrier}, {time.monotonic() - began:.1f} s after "
                            f"it started{took}")

        if job.job_id in self.fused:
            run = self._start_fused(job, committed)
        else:
            run = start_job(self.spark, self.pipeline, job, self.settings, on_barrier=committed,
                            drain_flag=self._drain_flag, state=state)
        setup.append(time.monotonic() - began)
        self._processors[job.job_id] = run.processor
        return run.query

    def _start_fused(self, job: Job, committed: Callable[[BarrierWork], None]) -> JobRun:
        """Start ``job`` as a member of its fused group: a thread of this driver that follows the
        state (``spark_jobs.ops.fused``). Its streaming checkpoint, from a run without fusion, is
        removed: were it ever run as its own query again, it would start from its table's newest
        exact point (``work_for``), not replay old batches."""
        if self._follower is None:
            self._follower = StateFollower(self.settings, Topics(self.settings.topic_prefix))
            self._follower.start()
            self._follower.wait_current(timeout=60)  # a member never plans from a state still being read
        with self._follower.reader.lock:
            state = self._follower.reader.state.copy()
        table = declared_table(self.settings, job, state).table
        Storage(self.spark).delete(checkpoint_location(self.settings, job.job_id, table))
        processor = job_processor(self.spark, self.pipeline, job, self.settings, state)
        processor.publisher.fused_with = self.fused[job.job_id]
        member = FusedJob(processor, job.job_id, self._follower, self.settings.barriers.catchup_stride,
                          on_barrier=committed, drain_flag=self._drain_flag)
        return JobRun(member, processor)

    def poll(self) -> None:
        """Stop jobs that were ended, stop stuck ones (the watchdog), notice failed ones and
        restart those whose backoff has passed. Raises once Spark's JVM exited: every job went with it."""
        if (code := driver_exit_code(self.spark)) is not None:
            raise jvm_exited_error(code)
        now = time.monotonic()
        state = self._state_each_second(now)
        if state is not None:
            if self.follow_status:
                self._report_progress(state, now)
                for job_id in list(self.queries):
                    if (known := state.jobs.get(job_id)) is not None and known.status in END_STATUSES:
                        self._end(known)
            self._watch(state, now)
        for job_id, query in list(self.queries.items()):
            if query.isActive:
                continue
            job = next(j for j in self.pipeline.jobs if j.job_id == job_id)
            if job_id not in self._retry_at:
                self._close(job_id)
                error = query.exception()
                self.failures[job_id] = self.failures.get(job_id, 0) + 1
                first_line = self._stuck.pop(job_id, None) or (str(error).splitlines()[0] if error else "stopped")
                if job_id in self.fused:
                    del self.fused[job_id]
                    self.report(f"job {job_id} leaves its fused group: it runs as its own streaming query from now on")
                if self.max_restarts is not None and self.failures[job_id] > self.max_restarts:
                    self._give_up(job, first_line)
                    continue
                delay = min(self.max_backoff, 2.0 ** (self.failures[job_id] - 1))
                self._retry_at[job_id] = now + delay
                self._watchdog.forget(job_id)
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
        reason = f"failed {self.failures[job.job_id]} time(s): {error}"[:500]
        try:
            outcome = emit(self.settings, DeregisterJob(new_request_id(), job.job_id, JobStatus.FAILED, reason))
            if not outcome.accepted:
                self.report(f"could not record job {job.job_id} as FAILED: {outcome.reason}")
        except Exception as exc:  # noqa: BLE001 - the job stays stopped here either way
            self.report(f"could not record job {job.job_id} as FAILED: {exc}")
        self.report(f"job {job.job_id} gave up after {self.failures[job.job_id]} failure(s) (FAILED): {error}")
        self._tell("on_failed", JobEvent(job.job_id, job.sink, JobStatus.FAILED, reason, error))
        self._ended(job.job_id, JobStatus.FAILED)

    def _state_each_second(self, now: float) -> MetaState | None:
        """The coordinator's state, read at most once a second while there are jobs to follow or watch."""
        if now - self._status_read_at < 1.0 or not self.queries or not (self.follow_status or self.settings.stuck_after_s):
            return None
        self._status_read_at = now
        return self._read_state("the jobs' state")

    def _watch(self, state: MetaState, now: float) -> None:
        """Stop each running job the watchdog finds stuck (``spark_jobs.ops.watchdog``); the poll
        then restarts it like a failed one."""
        for job_id, query in list(self.queries.items()):
            job = state.jobs.get(job_id)
            if job is None or job.status != JobStatus.RUNNING or job_id in self._retry_at or not query.isActive:
                self._watchdog.forget(job_id)
                continue
            done, ready = state.done_through(job), ready_barrier(state, job)
            stuck_for = self._watchdog.observe(job_id, done, ready, functools.partial(self._activity, query), now)
            if stuck_for is None:
                continue
            why = (f"stuck: its table holds barrier {done} while barrier {ready} is ready for it, and neither its table "
                   f"nor its Spark work moved for {stuck_for:.0f} s (LOCKSTEP_STUCK_AFTER_S)")
            self.report(f"job {job_id} is {why}; restarting it")
            job_metrics.stuck.labels(job_id).inc()
            self._watchdog.restarted(job_id, now)
            self._stuck[job_id] = why
            try:
                query.stop()  # cancels its Spark jobs; this poll restarts it after the backoff
            except Exception as exc:  # noqa: BLE001 - reported; the restart is tried all the same
                self.report(f"job {job_id} did not stop cleanly: {spark_error(exc)}")

    def _activity(self, query: JobQuery) -> tuple[int, int]:
        """How far the Spark work of ``query``'s run got: its newest Spark job (every job of a run
        is in the run's job group) and the tasks finished in its running ones."""
        tracker = self.spark.sparkContext.statusTracker()
        ids = set(tracker.getJobIdsForGroup(str(query.runId)))
        finished = 0
        for spark_job in ids.intersection(tracker.getActiveJobsIds()):
            info = tracker.getJobInfo(spark_job)
            for stage in info.stageIds if info is not None else ():
                if (stage_info := tracker.getStageInfo(stage)) is not None:
                    finished += stage_info.numCompletedTasks
        return max(ids, default=-1), finished

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
            _await_batch(query, time.monotonic() + self.finish_timeout)
        query.stop()
        self._close(job.job_id)
        why = f": {job.reason}" if job.reason else ""
        self.report(f"job {job.job_id} stopped ({job.status}{why})")
        hook = {JobStatus.FINISHED: "on_finished", JobStatus.CANCELED: "on_canceled"}.get(job.status, "on_failed")
        self._tell(hook, JobEvent(job.job_id, job.sink, job.status, job.reason))
        self._ended(job.job_id, job.status)

    def _close(self, job_id: str) -> None:
        """``job_id``'s query stopped: let its table's upkeep finish (reported if it failed)."""
        processor = self._processors.pop(job_id, None)
        if processor is not None:
            try:
                processor.close()
            except Exception as exc:  # noqa: BLE001 - upkeep is an optimisation; the next start redoes it
                self.report(f"job {job_id}: its table's upkeep did not finish: {spark_error(exc)}")

    def _ended(self, job_id: str, status: str) -> None:
        """Record a job ended here, once its hooks have heard of it (``ended`` is the last word)."""
        if self.renewals is not None:
            self.renewals.forget(job_id)
        self.ended[job_id] = status

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

    def stop(self, drain_s: float = 0.0) -> None:
        """Stop every job. With ``drain_s``, first let each job's barrier in progress commit (no
        new one is offered to it) for up to that many seconds, so its query stops between
        batches instead of cutting a Spark job off; then stop the queries."""
        if self._upkeep is not None:
            self._upkeep.close()
        if driver_exit_code(self.spark) is not None:  # Spark's JVM is gone, and its queries with it
            self.queries.clear()
        if drain_s > 0 and self.queries:
            self._drain_flag.parent.mkdir(parents=True, exist_ok=True)
            self._drain_flag.touch()
            deadline = time.monotonic() + drain_s
            for query in self.queries.values():
                _await_batch(query, deadline)
        for job_id, query in self.queries.items():
            try:
                query.stop()
            except Exception as exc:  # noqa: BLE001 - a batch that would not end (stopTimeout): stop the rest
                self.report(f"job {job_id} did not stop cleanly: {spark_error(exc)}")
            self._close(job_id)
        self._drain_flag.unlink(missing_ok=True)
        if self.renewals is not None:
            self.renewals.close()
        if self._follower is not None:
            self._follower.stop()
            self._follower = None
        if self._status_reader is not None:
            self._status_reader.close()
            self._status_reader = None
