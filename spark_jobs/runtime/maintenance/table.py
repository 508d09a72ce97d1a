"""What one barrier's maintenance of a derived table works with, and small frame helpers.

``MaintainedTable`` holds the table's sink, its plan, its schema with the columns and key that
follow from it, and reads its sources in one step (``frames``, ``views``): each at a version,
or the rows versions changed with a weight (+1 inserted, -1 retracted). Every way of
maintaining the table (``change_rows``, ``aggregates``, ``writes``, ``functions``) reads it and
ends in its ``commit``, handing it the barrier's write as a value (``commits.Write``), so the
commit never calls back into the way that made it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from coordinator.domain.snapshot import HIDDEN
from coordinator.domain.work import BarrierWork
from coordinator.settings import CrashAt
from spark_jobs.planning.pipeline import DerivedTable
from spark_jobs.planning.plan import WEIGHT, Plan, output_key
from spark_jobs.runtime.commits import DeltaSink, Write
from spark_jobs.runtime.costs import CostChoice
from spark_jobs.runtime.delta_log import appended_files, change_feed, changed_rows, read_files, read_version
from spark_jobs.runtime.pruning import few_keys, within
from spark_jobs.runtime.stopwatch import Stopwatch

REWRITE_LIMIT_BYTES = 4 << 20


def same_values(left: DataFrame, right: DataFrame, pairs: list[tuple[str, str]]) -> Column:
    """Null-safe equality of column pairs: GROUP BY and join keys may be NULL (no pairs, the
    empty key of one global group: every row matches)."""
    equal = [left[x].eqNullSafe(right[y]) for x, y in pairs]
    return functools.reduce(lambda a, b: a & b, equal) if equal else F.lit(True)


def keys_to_join(keys: DataFrame) -> tuple[DataFrame, list[Row] | None]:
    """The changed keys to join with, and their rows when few enough to filter reads with
    (read once, then joined from the driver's copy); else broadcast as they are."""
    found = few_keys(keys)
    return (F.broadcast(keys), None) if found is None else (F.broadcast(found[0]), found[1])


def narrowed(frame: DataFrame, rows: list[Row] | None, pairs: list[tuple[str, str]]) -> DataFrame:
    """``frame`` filtered to the value ranges of the changed keys ``rows`` (``pruning.within``)."""
    return frame if rows is None or not pairs else frame.where(within(rows, pairs))


def visible(frame: DataFrame) -> DataFrame:
    """A table's rows as its readers see them: without the bookkeeping columns (``HIDDEN``)."""
    return frame.select(*[c for c in frame.columns if not c.startswith(HIDDEN)])


@dataclass
class MaintainedTable:
    """One derived table as its job maintains it (``TableMaintainer`` makes it)."""

    spark: SparkSession
    table: DerivedTable
    plan: Plan  # a ROW_WISE plan becomes FULL_REFRESH if its function is found not to be row-wise
    job_id: str
    locate: Callable[[str], str]  # table name -> its location (Settings.table_location)
    sink: DeltaSink
    query_id: str  # the job's query, kept with each commit: a changed query recomputes
    costs: CostChoice
    crash_at: CrashAt | None = None
    compact_every: int = 0
    rewrite_limit_bytes: int = REWRITE_LIMIT_BYTES
    schema: StructType | None = None  # the table's, once known
    dlq: DeltaSink | None = None  # a Python table's dead letters, made at the first one
    watch: Stopwatch = field(default_factory=Stopwatch)  # the phases of the barrier in progress
    cached: list[DataFrame] = field(default_factory=list)
    # the barrier's change rows of sources read another way (changelog tables: ``changelog_changes``)
    prepared: dict[str, DataFrame] = field(default_factory=dict)
    columns: list[str] = field(init=False, default_factory=list)  # the table's, once its schema is known
    key: list[str] = field(init=False, default_factory=list)  # its key columns (``output_key``), likewise

    def __post_init__(self) -> None:
        if self.schema is not None:
            self.known(self.schema)

    def known(self, schema: StructType) -> None:
        """The table's schema is ``schema`` (its first result's, or a changed query's): its
        columns and key follow from it, kept so the barrier's steps need not ask."""
        self.schema = schema
        self.columns = [f.name for f in schema.fields]
        self.key = list(output_key(self.plan, [c for c in self.columns if not c.startswith(HIDDEN)]) or ())

    # -- reading sources ------------------------------------------------------------------------

    def frames(self, versions: Mapping[str, int], changes: Mapping[str, tuple[int, int]] | None = None,
               ) -> dict[str, DataFrame]:
        """Each source of ``versions`` at that version, and each of ``changes`` as its rows
        changed in versions ``(old, new]`` with a weight of +1 or -1: the files those versions
        added, where they only appended (``delta_log.changed_rows``), else Delta's change data
        feed (or, for a changelog table, ``prepared``). One step for all a query reads."""
        frames = {s: read_version(self.spark, self.locate(s), v) for s, v in versions.items()}
        for s, (old, new) in (changes or {}).items():
            frames[s] = self.prepared[s] if s in self.prepared else \
                changed_rows(self.spark, self.locate(s), old, new, WEIGHT)
        return frames

    def views(self, versions: Mapping[str, int], changes: Mapping[str, tuple[int, int]] | None = None,
              weighted: bool = False) -> None:
        """``frames`` named in this job's own session (temp views), for the query to read.
        ``weighted`` (the delta rule's terms): each snapshot with a weight of +1, the changes
        broadcast."""
        frames = self.frames(versions, changes)
        if weighted:
            frames = {name: F.broadcast(frame) if name in (changes or {}) else frame.withColumn(WEIGHT, F.lit(1))
                      for name, frame in frames.items()}
        self.bind(frames)

    @staticmethod
    def bind(frames: Mapping[str, DataFrame]) -> None:
        """Name each source in this job's own session (temp views), for the query to read."""
        for name, frame in frames.items():
            frame.createOrReplaceTempView(name)

    def snapshot(self, table: str, version: int) -> DataFrame:
        return read_version(self.spark, self.locate(table), version)

    def snapshots(self, work: BarrierWork) -> dict[str, DataFrame]:
        """Each source at its exact-point version for the barrier."""
        return self.frames(work.source_versions)

    def changes(self, table: str, old: int, new: int) -> DataFrame:
        """Rows of ``table`` changed in versions ``(old, new]``, weighted (``frames``)."""
        return self.frames({}, {table: (old, new)})[table]

    def added(self, table: str, old: int, new: int) -> tuple[DataFrame, list[str] | None] | None:
        """The rows versions ``(old, new]`` of ``table`` added, with the data files that hold just
        them where those versions only appended; None if they also changed or removed rows (an
        update: a Spark job looks, only where they were not appends)."""
        appended = appended_files(self.spark, self.locate(table), old, new)
        if appended is not None:
            return read_files(self.spark, *appended), appended.paths
        feed = change_feed(self.spark, self.locate(table), old, new, WEIGHT)
        return None if feed.where(F.col(WEIGHT) < 0).limit(1).count() else (feed.drop(WEIGHT), None)

    # -- the table ------------------------------------------------------------------------------

    def cache(self, frame: DataFrame) -> DataFrame:
        """Cache a frame used more than once in this barrier; released after the barrier's
        ``commit`` (or by ``release``, where a barrier ends without one)."""
        self.cached.append(frame.cache())
        return frame

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()
        self.cached.clear()

    def commit(self, work: BarrierWork, write: Write, layout: str | None = None) -> int:
        """Commit the barrier's write to the table (``DeltaSink.commit``): its version. The
        barrier's cached frames are released after it, committed or not."""
        try:
            return self.sink.commit(work.barrier, work.generation, write, work.source_versions, self.query_id,
                                    self.watch, self.costs.state() if self.plan.incremental else None, layout)
        finally:
            self.release()
