"""Job status hooks: code that runs when a job starts or ends, in the process that runs it.

The Supervisor calls every registered hook with a ``JobEvent``: ``on_created`` when it starts a
job for the first time, ``on_failed`` when the job's query dies with an error (status RUNNING:
it is restarted; FAILED: the Supervisor gave it up after ``max_restarts``), ``on_finished`` /
``on_canceled`` when ``lockstep stop`` ended it. A hook that raises is reported and does not
stop the job or the other hooks.

Example::

    class Notify(JobHooks):
        def on_failed(self, event: JobEvent) -> None:
            page_oncall(f"{event.job_id} failed: {event.error}")

    Supervisor(spark, pipeline, settings, hooks=[Notify()]).start()
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobEvent:
    """What happened to one job. ``status`` is the job's status now (RUNNING, FINISHED,
    CANCELED or FAILED); ``reason`` what ``lockstep stop`` recorded; ``error`` the first line
    of a failure."""

    job_id: str
    sink: str
    status: str
    reason: str = ""
    error: str = ""


class JobHooks:
    """Override the methods you need; the defaults do nothing."""

    def on_created(self, event: JobEvent) -> None:
        """The job's streaming query was started for the first time in this process."""

    def on_finished(self, event: JobEvent) -> None:
        """The job was stopped after the barrier it was on (``lockstep stop JOB``)."""

    def on_failed(self, event: JobEvent) -> None:
        """The job's query died with ``event.error``; RUNNING: it is restarted after a backoff,
        FAILED: it was given up."""

    def on_canceled(self, event: JobEvent) -> None:
        """The job was stopped at once (``lockstep stop JOB --cancel``)."""
