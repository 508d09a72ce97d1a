"""A fused job: a derived job of a group (``spark_jobs.planning.fusion``) run by a thread of the
runner's driver instead of a streaming query of its own.

The thread waits on the state the driver follows (one ``StateFollower`` for every member) and,
the moment its sources' commits of a barrier are folded there, processes that barrier with the
same ``work_for`` and the same processor as a streaming job: one Delta commit per barrier with
its txn mark, then its completion. What it saves is the job's own micro-batch per barrier (the
wait for its trigger, the offset and commit logs, the Spark job that collects the barrier rows)
and the source runner process that follows the state for it. Its Spark jobs run in its own
scheduler pool and job group, so the watchdog and the FAIR scheduler see it as before.

To the ``Supervisor`` it looks like a ``StreamingQuery`` (``isActive``, ``status``,
``exception()``, ``stop()``, ``runId``): a member that raises stops, and the Supervisor
restarts it as a streaming query of its own (it leaves the group for the rest of the run).

Example::

    follower = StateFollower(settings, Topics(settings.topic_prefix)); follower.start()
    member = FusedJob(job_processor(spark, pipeline, job, settings), job.job_id, follower,
                      settings.barriers.catchup_stride)
    ...
    member.stop()
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coordinator.client.state import StateFollower
from coordinator.domain.events import END_STATUSES
from coordinator.domain.work import BarrierWork, job_to_run, ready_barrier, work_for
from spark_jobs.runtime.ingest import RootIngestion
from spark_jobs.runtime.ivm import TableMaintainer

WAKE_S = 1.0  # longest wait for the state before looking again (a stop or a drain flag wakes it sooner)
STOP_WAIT_S = 60.0  # how long ``stop`` waits for the barrier in progress to give up


class FusedJob:
    """Processes one job's barriers in a thread, as its sources commit them (see the module)."""

    def __init__(self, processor: RootIngestion | TableMaintainer, job_id: str, follower: StateFollower,
                 stride: int, on_barrier: Callable[[BarrierWork], None] | None = None,
                 drain_flag: Path | None = None) -> None:
        self.processor = processor
        self.job_id = job_id
        self.runId = f"fused-{job_id}-{uuid.uuid4().hex[:8]}"  # noqa: N815 - StreamingQuery's name; the job group
        self._follower = follower
        self._stride = stride
        self._on_barrier = on_barrier
        self._drain_flag = drain_flag
        self._stopping = threading.Event()
        self._busy = False
        self._error: BaseException | None = None
        self._at: tuple[int, int] | None = None  # (generation, the newest barrier handed to the processor)
        self._folded = -1  # the follower's events folded when the state was last looked at
        self._thread = threading.Thread(target=self._run, name=f"lockstep-{job_id}", daemon=True)
        self._thread.start()

    @property
    def isActive(self) -> bool:  # noqa: N802 - StreamingQuery's name
        return self._thread.is_alive()

    @property
    def status(self) -> dict[str, Any]:
        return {"isTriggerActive": self._busy}

    def exception(self) -> BaseException | None:
        return self._error

    def stop(self) -> None:
        """Stop the thread: Spark jobs in progress are cancelled (their barrier is done again at
        the next start, which Delta's txn mark makes safe)."""
        self._stopping.set()
        with self._follower.reader.advanced:
            self._follower.reader.advanced.notify_all()
        self.processor.spark.sparkContext.cancelJobGroup(self.runId)
        self._thread.join(STOP_WAIT_S)

    def _run(self) -> None:
        context = self.processor.spark.sparkContext
        context.setLocalProperty("spark.scheduler.pool", self.job_id)  # (this thread's own)
        context.setJobGroup(self.runId, f"lockstep job {self.job_id}", interruptOnCancel=True)
        try:
            while (works := self._next()) is not None:
                self._busy = True
                try:
                    for work in works:
                        self.processor.process(work)
                        if self._on_barrier is not None:
                            self._on_barrier(work)
                finally:
                    self._busy = False
        except BaseException as exc:  # noqa: BLE001 - the Supervisor reports it and restarts the job
            if not self._stopping.is_set():
                self._error = exc

    def _next(self) -> list[BarrierWork] | None:
        """The next barriers to process, once the state has them; None once stopping."""
        reader = self._follower.reader
        with reader.advanced:
            while not self._stopping.is_set():
                if reader.stats.events_folded == self._folded:  # the state has not changed: nothing new
                    reader.advanced.wait(WAKE_S)
                    continue
                self._folded = reader.stats.events_folded
                state = reader.state
                job = job_to_run(state, self.job_id)
                if job.status not in END_STATUSES and not self._draining():
                    start = self._at[1] if self._at is not None and self._at[0] == job.generation else job.resume_barrier
                    end = max(job.resume_barrier, ready_barrier(state, job))
                    if end > start:
                        self._at = (job.generation, end)
                        works = work_for(state, job, start, end, self._stride)
                        if works:
                            return works
        return None

    def _draining(self) -> bool:
        return self._drain_flag is not None and self._drain_flag.exists()
