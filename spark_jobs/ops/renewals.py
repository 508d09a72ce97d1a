"""A runner's word that it is alive, for the jobs whose CTAS table has no first commit yet.

Before its first commit such a table has no other sign of life; the leader drops a pending
table nothing renewed for twice the liveness window (``decide.abandoned_tables``). Renewals
start the moment the pipeline is registered, before Spark starts (a session can take half a
minute on a busy machine), and come every third of the window from a thread of their own, so a
runner busy restarting a job or waiting for a barrier never misses one.

Example::

    renewals = Renewals(settings, ["maintain_totals"], report=print).start()
    ...                      # start Spark and the jobs
    renewals.forget("maintain_totals")   # a job this runner stopped
    renewals.close()
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from coordinator.client.commands import CommandClient, new_request_id
from coordinator.client.state import StateReader
from coordinator.client.topics import Topics
from coordinator.domain import RenewJob
from coordinator.settings import Settings


class Renewals:
    """Sends ``RenewJob`` for each of ``job_ids`` whose table is pending, now and every third of
    the liveness window, until closed."""

    def __init__(self, settings: Settings, job_ids: Iterable[str],
                 report: Callable[[str], None] = lambda message: None) -> None:
        self.settings, self.report = settings, report
        self.every_s = max(settings.barriers.liveness_ms / 3000, 0.2)
        self.sent = 0
        self._jobs = set(job_ids)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lockstep-renewals", daemon=True)

    def start(self) -> Renewals:
        self._thread.start()
        return self

    def forget(self, job_id: str) -> None:
        """Renew ``job_id`` no more (this runner stopped it)."""
        with self._lock:
            self._jobs.discard(job_id)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _loop(self) -> None:
        reader: StateReader | None = None
        client: CommandClient | None = None
        try:
            while not self._stop.is_set():
                try:
                    reader = reader or StateReader(self.settings, Topics(self.settings.topic_prefix))
                    client = client or CommandClient(self.settings)
                    self._renew(reader, client)
                except Exception as exc:  # noqa: BLE001 - renewed again next time; the jobs keep running
                    self.report(f"could not renew the jobs of pending tables: {exc}")
                self._stop.wait(self.every_s)
        finally:
            for closable in (reader, client):
                if closable is not None:
                    closable.close()

    def _renew(self, reader: StateReader, client: CommandClient) -> None:
        state = reader.read_to_end(timeout=max(self.every_s, 10.0))
        pending = set(state.pending())
        with self._lock:
            jobs = sorted(j for j in self._jobs if j in state.jobs and state.jobs[j].sink in pending)
        for job_id in jobs:
            if self._stop.is_set():
                return
            outcome = client.emit(RenewJob(new_request_id(), job_id), timeout=max(self.every_s, 10.0))
            self.sent += 1
            if not outcome.accepted:
                self.report(f"could not renew job {job_id}: {outcome.reason}")
