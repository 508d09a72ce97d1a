"""A job status hook that remembers what it heard, for Supervisor tests."""

from __future__ import annotations

from spark_jobs.hooks import JobEvent, JobHooks


class Recorder(JobHooks):
    def __init__(self) -> None:
        self.events: list[tuple[str, JobEvent]] = []

    def on_created(self, event: JobEvent) -> None:
        self.events.append(("created", event))

    def on_finished(self, event: JobEvent) -> None:
        self.events.append(("finished", event))

    def on_failed(self, event: JobEvent) -> None:
        self.events.append(("failed", event))

    def on_canceled(self, event: JobEvent) -> None:
        self.events.append(("canceled", event))

    def of(self, job_id: str) -> list[str]:
        return [what for what, event in self.events if event.job_id == job_id]
