"""CREATE TABLE AS SELECT, all or nothing: a table that never committed goes away with its job.

A CTAS table is declared as pending: the coordinator lists it (and readers can read it) only
once its job committed the first barrier, and that first write is what creates the Delta table.
If the job ends before that (it failed for good, or ``lockstep stop`` ended it), this hook
drops the catalog entry (the DropTable command) and deletes whatever files the job left.
The Supervisor always runs it; it is an ordinary ``JobHooks``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from coordinator.client.commands import emit, new_request_id
from coordinator.client.rest import get_json
from coordinator.domain import DropTable
from coordinator.domain.events import JobStatus
from coordinator.domain.roles import Role
from coordinator.settings import Settings
from spark_jobs.ops.hooks import JobEvent, JobHooks
from spark_jobs.ops.tables import remove_table
from spark_jobs.runtime.storage import Storage


@dataclass
class CtasCleanup(JobHooks):
    storage: Storage
    settings: Settings
    report: Callable[[str], None] = lambda message: None

    def on_failed(self, event: JobEvent) -> None:
        if event.status != JobStatus.RUNNING:  # RUNNING: the Supervisor restarts it, the table may still come
            self._drop_if_never_created(event)

    def on_canceled(self, event: JobEvent) -> None:
        self._drop_if_never_created(event)

    def on_finished(self, event: JobEvent) -> None:
        self._drop_if_never_created(event)

    def _drop_if_never_created(self, event: JobEvent) -> None:
        if event.sink not in get_json(self.settings, "/topology").get("pending", []):
            return  # created (it stays), or not a CTAS table
        why = f"job {event.job_id} ended ({event.status}) before its first commit"
        outcome = emit(self.settings, DropTable(new_request_id(), event.sink, why), role=Role.JOB)  # its own table
        if not outcome.accepted:
            self.report(f"table {event.sink} was not dropped: {outcome.reason}")
            return
        remove_table(self.storage, self.settings, event.sink)
        self.report(f"table {event.sink} dropped: {why}")
