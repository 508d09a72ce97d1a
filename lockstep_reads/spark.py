"""A snapshot read by Spark: ``open_snapshot(tables, ..., spark=session)`` binds each table a
query names to its version in the snapshot (Delta time travel through the session) and returns
DataFrames; queries are Spark SQL. Only a snapshot given a session imports this module, so the
light path never imports pyspark.

Example::

    from lockstep_reads import open_snapshot

    with open_snapshot(["user_item_amount", "user_item_price"], spark=spark) as snap:
        snap.sql("SELECT a.user_id, a.item_id, p.total_price / a.total_amount AS unit_price "
                 "FROM user_item_amount a JOIN user_item_price p "
                 "ON a.user_id = p.user_id AND a.item_id = p.item_id").show()
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Protocol

import sqlglot
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from sqlglot import exp
from sqlglot.errors import ParseError

from coordinator.client.snapshots import SnapshotError
from coordinator.client.state import lineage_tables
from coordinator.domain.lineage import LINEAGE_TABLES, LineageTable
from coordinator.domain.snapshot import HIDDEN
from coordinator.settings import Settings
from coordinator.spark_sql import SPARK
from lockstep_reads.statements import QueryError
from lockstep_reads.tables import VersionGone
from spark_jobs.planning.pipeline import tables_read
from spark_jobs.runtime.delta_log import latest_version, read_version
from spark_jobs.runtime.session import spark_error


class PinnedTables(Protocol):
    """What the engine reads of a snapshot (``lockstep_reads.snapshot.Snapshot``)."""

    settings: Settings
    barrier: int | None
    versions: dict[str, int | None]

    def location(self, name: str) -> str: ...

    def pinned(self, names: Sequence[str]) -> dict[str, tuple[str, int | None]]: ...


def is_meta_table(name: str) -> bool:
    """Whether ``name`` is one of the lineage tables (``__meta_*``, any case)."""
    return name.lower() in LINEAGE_TABLES


def referenced_tables(query: str) -> list[str]:
    """Data tables a Spark SQL query reads (not its CTE names, not lineage tables), sorted.

    >>> referenced_tables("WITH x AS (SELECT * FROM b) SELECT * FROM x JOIN a ON x.k = a.k JOIN __meta_etl_sink")
    ['a', 'b']
    """
    try:
        tree = sqlglot.parse_one(query, read=SPARK)
    except ParseError as exc:
        raise QueryError(f"the SQL does not parse: {exc}") from exc
    return [t for t in tables_read(tree) if not is_meta_table(t)]


def lineage_frames(spark: SparkSession, tables: Mapping[str, LineageTable]) -> dict[str, DataFrame]:
    """The lineage tables (``coordinator.domain.lineage``) as DataFrames of ``spark``."""
    frames = {}
    for name, table in tables.items():
        at = [i for i, (_, kind) in enumerate(table.columns) if kind == "TIMESTAMP"]
        rows = [tuple(datetime.fromtimestamp(v / 1000, UTC) if i in at else v for i, v in enumerate(row))
                for row in table.rows]
        frames[name] = spark.createDataFrame(rows, ", ".join(f"{column} {kind}" for column, kind in table.columns))
    return frames


class SparkEngine:
    """Reads a snapshot's versions with a SparkSession: DataFrames, Spark SQL."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._lineage = False

    def newest(self, snap: PinnedTables, name: str) -> int:
        """The newest version of ``name`` now, from a listing of its log (read-uncommitted)."""
        return latest_version(self.spark, snap.location(name))

    def table(self, snap: PinnedTables, name: str) -> DataFrame:
        """``name`` at the snapshot's version, its bookkeeping columns hidden."""
        path, version = snap.pinned([name])[name]
        try:
            frame = read_version(self.spark, path, version)
        except AnalysisException as exc:
            if version is not None and ("version" in str(exc).lower() or "PATH_NOT_FOUND" in str(exc)):
                raise VersionGone(
                    f"table {name!r} version {version} (barrier {snap.barrier}) is no longer available: it was "
                    "vacuumed or its log expired; read a newer barrier, or hold a repeatable-read lease while "
                    "reading") from exc
            raise SnapshotError(f"cannot read table {name!r} at {path}: {spark_error(exc)}") from exc
        return frame.select(*[c for c in frame.columns if not c.startswith(HIDDEN)])

    def sql(self, snap: PinnedTables, query: str) -> DataFrame:
        """``query`` with every table it names bound to its version in ``snap`` (lineage tables
        ``__meta_*`` as they are now); ``QueryError`` if Spark cannot analyse it."""
        try:
            tree = sqlglot.parse_one(query, read=SPARK)
        except ParseError as exc:
            raise QueryError(f"the SQL does not parse: {exc}") from exc
        ctes = {cte.alias for cte in tree.find_all(exp.CTE)}
        views: dict[str, str] = {}
        for node in list(tree.find_all(exp.Table)):
            name = node.name
            if is_meta_table(name) and not self._lineage:
                for view, frame in lineage_frames(self.spark, lineage_tables(snap.settings)).items():
                    frame.createOrReplaceTempView(view)
                self._lineage = True
            if name in ctes or is_meta_table(name):
                continue
            if name not in views:
                views[name] = f"{HIDDEN}{name}_b{snap.barrier}_v{snap.versions.get(name)}_{uuid.uuid4().hex[:6]}"
                self.table(snap, name).createOrReplaceTempView(views[name])
            alias = node.alias or name
            node.replace(exp.Table(this=exp.to_identifier(views[name]), alias=exp.TableAlias(this=exp.to_identifier(alias))))
        try:
            return self.spark.sql(tree.sql(dialect=SPARK))
        except AnalysisException as exc:
            raise QueryError(spark_error(exc)) from exc
