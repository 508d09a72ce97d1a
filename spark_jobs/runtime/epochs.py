"""Barrier-delimited micro-batches: a Python streaming data source whose offsets are barrier ids.

``read(start)`` returns the barriers after ``start`` up to the newest one the job may process
(for a root job: the newest announced; for an intermediate job: the newest exact point of all
its sources), so every micro-batch covers whole barriers ``(start, end]`` and never splits
one. Each row of a batch is one barrier with what the job needs to process it (cuts, or source
versions); the job's ``foreachBatch`` then commits one Delta version per barrier and
publishes a completion.

An offset also names the job's generation: when a revision bumps it, the next micro-batch
starts over from the revision's barrier in the new generation (the running query follows;
nothing restarts it). A revised root job's first barrier carries ``restore_to``.

The reader runs in Spark's Python source runner, a separate process: a follower thread there
folds the state topics with the same StateReader as every other component, so asking for new
barriers costs no Kafka round trip and a query can ask every ``TRIGGER_MS``.

Example::

    spark.dataSource.register(BarrierSource)
    barriers = (spark.readStream.format("lockstep_barriers")
                .option("job_id", "ingest_shopping").options(**settings_options(settings)).load())
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from coordinator.domain import JobState, MetaState
from coordinator.domain.events import END_STATUSES
from coordinator.domain.work import ready_barrier, work_for
from coordinator.settings import Settings

SCHEMA = "barrier BIGINT, generation BIGINT, ts_ms BIGINT, info STRING"
TRIGGER_MS = 50  # how often a job's query asks for new barriers


def settings_options(settings: Settings) -> dict[str, str]:
    """What the source runner process needs to reach the state topics."""
    return {
        "catchup_stride": str(settings.barriers.catchup_stride),
        "bootstrap": settings.bootstrap,
        "topic_prefix": settings.topic_prefix,
        "kafka_client": json.dumps(dict(settings.kafka_client)),
    }


def register_barrier_source(spark: Any) -> None:
    """Register ``lockstep_barriers`` once per Spark application (registration is global)."""
    from pyspark.errors import AnalysisException

    try:
        spark.dataSource.register(BarrierSource)
    except AnalysisException as exc:
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise


class BarrierSource(DataSource):
    """``spark.readStream.format("lockstep_barriers").option("job_id", ...)``."""

    @classmethod
    def name(cls) -> str:
        return "lockstep_barriers"

    def schema(self) -> str:
        return SCHEMA

    def simpleStreamReader(self, schema: Any) -> SimpleDataSourceStreamReader:  # noqa: N802 - pyspark API
        return BarrierReader(dict(self.options))


class BarrierReader(SimpleDataSourceStreamReader):
    """The barriers of one job. A follower thread keeps folding the state topics, so a trigger
    asks memory, not Kafka, and the trigger can be frequent. It is a *simple* reader: Spark asks
    it for the new rows when it plans a micro-batch and ships them with the plan, so no Python
    worker task runs to read them."""

    def __init__(self, options: dict[str, str]) -> None:
        self.job_id = options["job_id"]
        self.options = options
        self._follower: Any = None
        self._ready: tuple[int, int] | None = None  # (events folded, the newest barrier the job may process)

    def _following(self) -> Any:
        """The state follower, started on first use and caught up with the topics."""
        if self._follower is None:
            from coordinator.client.state import StateFollower
            from coordinator.client.topics import Topics

            settings = Settings(
                bootstrap=self.options["bootstrap"],
                topic_prefix=self.options["topic_prefix"],
                kafka_client=json.loads(self.options.get("kafka_client", "{}")),
            )
            follower = StateFollower(settings, Topics(settings.topic_prefix))
            follower.start()
            follower.wait_current(timeout=60)
            self._follower = follower
        return self._follower

    def _job(self, state: MetaState) -> JobState:
        job = state.jobs.get(self.job_id)
        if job is None:
            raise RuntimeError(f"job {self.job_id!r} is not registered with the coordinator (run `lockstep run` first)")
        return job

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 - pyspark API
        reader = self._following().reader
        with reader.lock:
            job = self._job(reader.state)
            return {"barrier": job.resume_barrier, "generation": job.generation}

    def read(self, start: dict[str, int]) -> tuple[Iterator[tuple[int, int, int, str]], dict[str, int]]:
        """The barriers after ``start`` the job may process now (none: ``start`` again)."""
        reader = self._following().reader
        with reader.lock:
            state = reader.state
            job = self._job(state)
            if job.status in END_STATUSES:
                return iter(()), start  # stopped (`lockstep stop`): no barrier after the one in progress
            folded = reader.stats.events_folded
            if self._ready is None or self._ready[0] != folded:  # the state changed since it was last asked
                self._ready = (folded, ready_barrier(state, job))
            end = {"barrier": max(job.resume_barrier, self._ready[1]), "generation": job.generation}
            if end == start:
                return iter(()), start
            return iter(self._rows(state, job, start, end)), end

    def readBetweenOffsets(self, start: dict[str, int], end: dict[str, int]) -> Iterator[tuple[int, int, int, str]]:  # noqa: N802
        """A batch again after a restart: the same barriers, planned from the state as it is."""
        reader = self._following().reader
        with reader.lock:
            return iter(self._rows(reader.state, self._job(reader.state), start, end))

    def _rows(self, state: MetaState, job: JobState, start: dict[str, int],
              end: dict[str, int]) -> list[tuple[int, int, int, str]]:
        first = start["barrier"]
        if start.get("generation", 0) != end.get("generation", 0):
            first = job.resume_barrier  # revised: start over from the revision's barrier
        if end.get("generation", 0) != job.generation:
            return []  # revised again meanwhile: the next batch starts over
        work = work_for(state, job, first, end["barrier"], int(self.options.get("catchup_stride", 10)))
        return [(w.barrier, w.generation, w.ts_ms, w.to_json()) for w in work]

    def commit(self, end: dict[str, int]) -> None:
        pass
