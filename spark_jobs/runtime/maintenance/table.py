"""What one barrier's maintenance of a derived table works with, and small frame helpers.

``MaintainedTable`` holds the table's sink, its plan and result schema, and reads its sources:
a snapshot at a version, or the rows versions changed with a weight (+1 inserted, -1
retracted). Every way of maintaining the table (``change_rows``, ``aggregates``, ``writes``,
``functions``) takes it.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from coordinator.domain.snapshot import HIDDEN
from coordinator.domain.work import BarrierWork
from coordinator.settings import CrashAt
from spark_jobs.planning.pipeline import DerivedTable
from spark_jobs.planning.plan import WEIGHT, Plan, output_key
from spark_jobs.runtime.commits import DeltaSink
from spark_jobs.runtime.costs import CostChoice
from spark_jobs.runtime.delta_log import appended_files, read_files, read_version
from spark_jobs.runtime.pruning import few_keys, within
from spark_jobs.runtime.stopwatch import Stopwatch

REWRITE_LIMIT_BYTES = 4 << 20
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


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


def netted(rows: DataFrame) -> DataFrame:
    """Change rows with equal values summed: those whose weights cancel are gone."""
    value_columns = [c for c in rows.columns if c != WEIGHT]
    return rows.groupBy(*value_columns).agg(F.sum(WEIGHT).alias(WEIGHT)).where(F.col(WEIGHT) != 0)


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

    # -- reading sources ------------------------------------------------------------------------

    def snapshot(self, table: str, version: int) -> DataFrame:
        return read_version(self.spark, self.locate(table), version)

    def snapshots(self, work: BarrierWork) -> dict[str, DataFrame]:
        """Each source at its exact-point version for the barrier."""
        return {s: self.snapshot(s, v) for s, v in work.source_versions.items()}

    def changes(self, table: str, old: int, new: int) -> DataFrame:
        """Rows of ``table`` changed in versions ``(old, new]`` with a weight of +1 or -1: the
        files those versions added, where they only appended (``appended_files``), else Delta's
        change data feed (or, for a changelog table, ``prepared``)."""
        if table in self.prepared:
            return self.prepared[table]
        appended = appended_files(self.spark, self.locate(table), old, new)  # (all weights +1)
        if appended is not None:
            return read_files(self.spark, *appended).withColumn(WEIGHT, F.lit(1))
        return self._feed(table, old, new)

    def added(self, table: str, old: int, new: int) -> tuple[DataFrame, list[str] | None] | None:
        """The rows versions ``(old, new]`` of ``table`` added, with the data files that hold just
        them where those versions only appended; None if they also changed or removed rows (an
        update: a Spark job looks, only where they were not appends)."""
        appended = appended_files(self.spark, self.locate(table), old, new)
        if appended is not None:
            return read_files(self.spark, *appended), appended.paths
        feed = self._feed(table, old, new)
        return None if feed.where(F.col(WEIGHT) < 0).limit(1).count() else (feed.drop(WEIGHT), None)

    def _feed(self, table: str, old: int, new: int) -> DataFrame:
        """Delta's change data feed of ``table``'s versions ``(old, new]``, weighted."""
        # read as the path identifier delta.`path`: `.load(path)` passes the options to Delta twice
        # (their given and lower-case spellings) and Spark warns three times a read
        path = self.locate(table).replace("`", "``")
        feed = (self.spark.read.option("readChangeFeed", "true").option("startingVersion", old + 1)
                .option("endingVersion", new).table(f"delta.`{path}`"))
        sign = F.when(F.col("_change_type").isin("insert", "update_postimage"), 1).otherwise(-1)
        return feed.withColumn(WEIGHT, sign).drop(*CDF_COLUMNS)

    def bind(self, frames: dict[str, DataFrame]) -> None:
        """Name each source in this job's own session (temp views), for the query to read."""
        for name, frame in frames.items():
            frame.createOrReplaceTempView(name)

    def bind_snapshots(self, work: BarrierWork) -> None:
        """Bind each source to its exact-point version for the barrier."""
        self.bind(self.snapshots(work))

    # -- the table ------------------------------------------------------------------------------

    def columns(self) -> list[str]:
        assert self.schema is not None
        return [f.name for f in self.schema.fields]

    def key(self) -> list[str]:
        key = output_key(self.plan, [c for c in self.columns() if not c.startswith(HIDDEN)])
        assert key is not None
        return list(key)

    def cache(self, frame: DataFrame) -> DataFrame:
        """Cache a frame used more than once in this barrier; released by ``release``."""
        self.cached.append(frame.cache())
        return frame

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()
        self.cached.clear()

    def observation(self, work: BarrierWork) -> Observation:
        return Observation(f"{self.job_id}_{work.generation}_{work.barrier}_{uuid.uuid4().hex[:6]}")

    def costs_state(self) -> dict[str, float] | None:
        """What the job measured of its ways to a barrier, kept with the commit (incremental plans)."""
        return self.costs.state() if self.plan.incremental else None

    def commit(self, work: BarrierWork, write: Callable[[], None], layout: str | None = None) -> int:
        """Commit the barrier's write to the table (``DeltaSink.commit``): its version."""
        return self.sink.commit(work.barrier, work.generation, write, work.source_versions, self.query_id,
                                self.watch, self.costs_state(), layout)
