"""CREATE TABLE AS SELECT from Python: ``ContinuousQuery(spark, sql).save_as("t").create()``.

All or nothing, as in a pipeline file: the table appears once its job committed the first
barrier, and a job that ends before that leaves nothing behind (``spark_jobs.ops.ctas_cleanup``).
"""

from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import sqlglot
from pyspark.sql import DataFrame, SparkSession

from coordinator.client.commands import emit, new_request_id
from coordinator.client.state import read_state
from coordinator.domain import DeregisterJob, MetaState
from coordinator.domain.errors import LockstepError
from coordinator.domain.events import JobStatus, TableKind
from coordinator.domain.snapshot import ReadLevel
from coordinator.settings import Settings
from coordinator.spark_sql import SPARK
from spark_jobs.ops.jobs import register_pipeline
from spark_jobs.ops.runner import Supervisor
from spark_jobs.planning.pipeline import DerivedTable, Pipeline, RootTable, tables_read


class CtasError(LockstepError):
    """A table could not be created; the message says why (nothing of it is left behind)."""


@dataclass
class ContinuousQuery:
    """A SQL query over Lockstep tables, for Python users: ``frame()`` is a DataFrame of its
    result on a consistent snapshot; ``save_as(name)`` makes it a continuously maintained table.

    Example::

        q = ContinuousQuery(spark, "SELECT k, SUM(v) AS total FROM events GROUP BY k")
        q.frame().show()                                        # what the table would hold now
        totals = q.save_as("totals").option("max_restarts", 3).create()
        ...
        totals.stop()                                           # FINISHED; the table stays
    """

    spark: SparkSession
    sql: str
    settings: Settings = field(default_factory=Settings.from_env)

    def frame(self, consistency: str = ReadLevel.READ_COMMITTED) -> DataFrame:
        from lockstep_reads.snapshot import open_snapshot
        from lockstep_reads.spark import referenced_tables

        snapshot = open_snapshot(referenced_tables(self.sql), consistency, settings=self.settings, spark=self.spark)
        snapshot.close()  # the frame stays readable; a lease would only outlive this call
        return snapshot.sql(self.sql)

    def save_as(self, name: str) -> TableBuilder:
        return TableBuilder(self, name)


@dataclass(frozen=True)
class TableBuilder:
    """``CREATE TABLE name AS <query>`` from Python. Options: ``max_restarts`` (failures after
    the table exists before the job is given up; default: never), ``timeout`` (seconds to wait
    for the first commit, default 300)."""

    query: ContinuousQuery
    name: str
    options: tuple[tuple[str, str], ...] = ()

    def option(self, key: str, value: object) -> TableBuilder:
        if key not in ("max_restarts", "timeout"):
            raise ValueError(f"unknown option {key!r}: use max_restarts or timeout")
        return replace(self, options=(*self.options, (key, str(value))))

    def create(self) -> RunningTable:
        """Create the table and run its job in this process; returns once the first barrier is
        committed (the table appears all at once). A failure before that removes everything
        and raises CtasError."""
        return self._create(if_not_exists=False)

    def create_if_not_exists(self) -> RunningTable | None:
        """As ``create``, but None (and nothing done) if the table exists already."""
        return self._create(if_not_exists=True)

    def _create(self, if_not_exists: bool) -> RunningTable | None:
        settings, options = self.query.settings, dict(self.options)
        state = read_state(settings)
        if self.name in state.tables:
            if if_not_exists:
                return None
            raise CtasError(f"table {self.name!r} exists already; use create_if_not_exists() or another name")
        table = DerivedTable(self.name, self.query.sql, tables_read(sqlglot.parse_one(self.query.sql, read=SPARK)))
        alone = Pipeline((), (table,))
        register_pipeline(settings, alone)
        job = alone.jobs[0]
        known = _known_pipeline(state, table)
        messages: list[str] = []
        supervisor = Supervisor(self.query.spark, known, settings, only=(job.job_id,), report=messages.append,
                                max_restarts=0)
        supervisor.start()
        deadline = time.monotonic() + float(options.get("timeout", 300))
        try:
            while True:
                supervisor.poll()
                if job.job_id in supervisor.ended:
                    raise CtasError(f"CREATE TABLE {self.name} AS SELECT failed before its first commit; the table "
                                    f"and its files were removed: {'; '.join(messages)}")
                if read_state(settings).created(self.name):
                    break
                if time.monotonic() > deadline:
                    raise CtasError(f"table {self.name!r} got no first commit within {options.get('timeout', 300)} "
                                    f"s; its job is still registered: `lockstep stop {job.job_id} --cancel` removes it")
                time.sleep(0.5)
        except BaseException:
            supervisor.stop()  # its renewals and state reader too: nothing of a failed CTAS stays behind
            raise
        restarts = options.get("max_restarts")
        supervisor.max_restarts = int(restarts) if restarts is not None else None
        return RunningTable(self.name, job.job_id, supervisor)


@dataclass
class RunningTable:
    """A table whose job runs in this process (created by ``TableBuilder.create``): the runtime's
    ``MaintainedTable`` is what its job writes, this is the handle that stops it."""

    name: str
    job_id: str
    supervisor: Supervisor
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self.supervisor.run, args=(self._stop,), daemon=True,
                                        name=f"lockstep-{self.job_id}")
        self._thread.start()

    def stop(self, cancel: bool = False) -> None:
        """End the job (FINISHED, or CANCELED with ``cancel``); the table keeps what it has."""
        status = JobStatus.CANCELED if cancel else JobStatus.FINISHED
        emit(self.supervisor.settings, DeregisterJob(new_request_id(), self.job_id, status, "RunningTable.stop"))
        self._stop.set()
        self._thread.join(30)
        self.supervisor.stop()


def _known_pipeline(state: MetaState, new: DerivedTable) -> Pipeline:
    """The tables the coordinator knows, as a pipeline, so the new table's plan knows its
    sources' keys: roots with their primary keys, derived tables with their writers' queries."""
    roots = tuple(RootTable(t.name, (), "", primary_key=t.primary_key) for t in state.tables.values() if t.kind == TableKind.ROOT)
    writers = sorted((j for j in state.jobs.values() if j.sql and j.sink != new.name), key=lambda j: j.registered_at_ms)
    derived = tuple(DerivedTable(j.sink, j.sql, j.sources) for j in writers)
    return Pipeline(roots, (*derived, new))


def __getattr__(name: str) -> Any:
    if name == "MaintainedTable":
        warnings.warn("spark_jobs.api.ctas.MaintainedTable is deprecated and goes in the next release: it is "
                      "RunningTable (spark_jobs.runtime's MaintainedTable is another thing)", DeprecationWarning,
                      stacklevel=2)
        return RunningTable
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
