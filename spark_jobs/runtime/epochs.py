"""Barrier-delimited micro-batches: a Python streaming data source whose offsets are barrier ids.

``read(start)`` returns the barriers after ``start`` up to the newest one the job may process
(for a root job: the newest announced; for an intermediate job: the newest exact point of all
its sources), so every micro-batch covers whole barriers ``(start, end]`` and never splits
one. Each row of a batch is one barrier with what the job needs to process it (cuts, or source
versions); the job's ``foreachBatch`` then commits one Delta version per barrier and
publishes a completion.

A runner that stops (``spark_jobs.ops.runner``) creates the file named by the ``drain_flag``
option: from then on no new barrier is offered, so the batch in progress commits and the query
can be stopped between batches instead of in the middle of one.

An offset also names the job's generation: when a revision bumps it, the next micro-batch
starts over from the revision's barrier in the new generation (the running query follows;
nothing restarts it). A revised root job's first barrier carries ``restore_to``. And it names
the job's table (``TableState.table_id``): an offset of another table of the same name (a
checkpoint copied, or left where a new table's went) is not continued; the job starts as a new
one would, from its table's newest exact point or its start rule, and says so.

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
import os
import sys
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from coordinator.domain import JobState, MetaState
from coordinator.domain.events import END_STATUSES
from coordinator.domain.work import job_to_run, ready_barrier, work_for
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
    """Register ``lockstep_barriers`` once per Spark session state (every job's query starts
    here; registering again would replace it, with a warning)."""
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    if not manager.dataSourceExists(BarrierSource.name()):
        spark.dataSource.register(BarrierSource)


def _quiet_hang_up(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
    """``sys.excepthook`` of a query's source runner process. Spark stops a query's Python source
    by closing the runner's socket; the runner then reads EOF, fails to report that back over
    the closed socket, and would print both tracebacks into the job's output at every stop. An
    error that began with that hang-up ends the process quietly; any other is printed."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, EOFError):
            return
        seen = seen.__context__
    sys.__excepthook__(kind, error, trace)


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
        sys.excepthook = _quiet_hang_up  # this process is the query's source runner (see there)
        self.job_id = options["job_id"]
        self.options = options
        self._follower: Any = None
        self._ready: tuple[int, int] | None = None  # (events folded, the newest barrier the job may process)
        self._refused: dict[str, int | str] | None = None  # the last offset of another table not continued

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

    def initialOffset(self) -> dict[str, int | str]:  # noqa: N802 - pyspark API
        reader = self._following().reader
        with reader.lock:
            return self._initial(reader.state, job_to_run(reader.state, self.job_id))

    @staticmethod
    def _initial(state: MetaState, job: JobState) -> dict[str, int | str]:
        return {"barrier": job.resume_barrier, "generation": job.generation, "table_id": _table_id(state, job)}

    def read(self, start: dict[str, int | str]) -> tuple[Iterator[tuple[int, int, int, str]], dict[str, int | str]]:
        """The barriers after ``start`` the job may process now (none: ``start`` again)."""
        reader = self._following().reader
        with reader.lock:
            state = reader.state
            job = job_to_run(state, self.job_id)
            if job.status in END_STATUSES or self._draining():
                # stopped (`lockstep stop`), or its runner is stopping: no barrier after the one in progress
                return iter(()), start
            begin = self._ours(state, job, start)
            folded = reader.stats.events_folded
            if self._ready is None or self._ready[0] != folded:  # the state changed since it was last asked
                self._ready = (folded, ready_barrier(state, job))
            end = {"barrier": max(job.resume_barrier, self._ready[1]), "generation": job.generation,
                   "table_id": _table_id(state, job)}
            if end == begin:
                return iter(()), begin  # (another table's offset: replaced by this one's at once)
            return iter(self._rows(state, job, begin, end)), end

    def _ours(self, state: MetaState, job: JobState, start: dict[str, int | str]) -> dict[str, int | str]:
        """``start`` if the checkpoint recorded it for this job's table, else where a new job starts."""
        if start.get("table_id") == _table_id(state, job):
            return start
        initial = self._initial(state, job)
        if start != self._refused:  # once per offset refused, not at every trigger
            self._refused = start
            print(f"lockstep: job {self.job_id}'s checkpoint holds an offset of another table {job.sink} "
                  f"(table id {start.get('table_id') or 'none'}, barrier {start.get('barrier')}; this table's id "
                  f"is {initial['table_id']}): it is not continued, the job starts over from barrier "
                  f"{initial['barrier']} as a new job would", file=sys.stderr, flush=True)
        return initial

    def _draining(self) -> bool:
        """Whether the runner asked for no new barriers (``drain_flag``: a file it creates when
        it stops, so the batch in progress commits and none starts after it)."""
        flag = self.options.get("drain_flag")
        return bool(flag) and os.path.exists(flag)

    def readBetweenOffsets(self, start: dict[str, int | str],  # noqa: N802
                           end: dict[str, int | str]) -> Iterator[tuple[int, int, int, str]]:
        """A batch again after a restart: the same barriers, planned from the state as it is."""
        reader = self._following().reader
        with reader.lock:
            job = job_to_run(reader.state, self.job_id)
            if end.get("table_id") != _table_id(reader.state, job):
                return iter(())  # another table's batch: none of its barriers are this table's
            return iter(self._rows(reader.state, job, self._ours(reader.state, job, start), end))

    def _rows(self, state: MetaState, job: JobState, start: dict[str, int | str],
              end: dict[str, int | str]) -> list[tuple[int, int, int, str]]:
        first = int(start["barrier"])
        if start.get("generation", 0) != end.get("generation", 0):
            first = job.resume_barrier  # revised: start over from the revision's barrier
        if end.get("generation", 0) != job.generation:
            return []  # revised again meanwhile: the next batch starts over
        work = work_for(state, job, first, int(end["barrier"]), int(self.options.get("catchup_stride", 10)))
        return [(w.barrier, w.generation, w.ts_ms, w.to_json()) for w in work]

    def commit(self, end: dict[str, int | str]) -> None:
        pass


def _table_id(state: MetaState, job: JobState) -> str:
    table = state.tables.get(job.sink)
    return table.table_id if table is not None else ""
