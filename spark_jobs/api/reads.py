"""Consistent snapshots for Spark users: every table of a read at the same barrier.

The coordinator says which Delta version of each table belongs to the barrier the read level
picks (the read levels: docs/reads.md); the snapshot then reads those versions with time travel.
Readers never block writers.

Example::

    with open_snapshot(spark, ["user_item_amount", "user_item_price"]) as snap:
        print(snap.barrier, snap.versions)
        snap.sql("SELECT a.user_id, a.item_id, p.total_price / a.total_amount AS unit_price "
                 "FROM user_item_amount a JOIN user_item_price p "
                 "ON a.user_id = p.user_id AND a.item_id = p.item_id").show()

``repeatable-read`` also takes a lease on those versions (renewed while the snapshot is open,
released by ``close``, expiring on its own if the process dies), so VACUUM keeps them. If the
renewals fail for longer than the lease's ttl (the coordinator or broker unreachable), the
lease lapses and the snapshot's next read raises ``SnapshotError``: vacuum may have deleted
what it reads.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

import sqlglot
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from sqlglot import exp

from coordinator.client.snapshots import CoordinatorUnreachable, Lease, SnapshotError, close_clients, pin_for_read
from coordinator.domain.snapshot import HIDDEN, ReadLevel
from coordinator.settings import Settings
from coordinator.spark_sql import SPARK
from spark_jobs.api.lineage import is_meta_table, register_lineage_views
from spark_jobs.planning.pipeline import tables_read
from spark_jobs.runtime.delta_log import latest_version, read_version
from spark_jobs.runtime.session import spark_error

__all__ = ["ConsistentSnapshot", "CoordinatorUnreachable", "SnapshotError", "close_clients", "open_snapshot",
           "referenced_tables"]


def referenced_tables(query: str) -> list[str]:
    """Data tables a SQL query reads (not its CTE names, not lineage tables), sorted.

    >>> referenced_tables("WITH x AS (SELECT * FROM b) SELECT * FROM x JOIN a ON x.k = a.k JOIN __meta_etl_sink")
    ['a', 'b']
    """
    return [t for t in tables_read(sqlglot.parse_one(query, read=SPARK)) if not is_meta_table(t)]


@dataclass
class ConsistentSnapshot:
    """Tables at the versions of one barrier. Use ``table`` and ``sql``; ``close`` when done."""

    spark: SparkSession
    settings: Settings
    level: str
    barrier: int | None
    versions: dict[str, int | None]
    data_ts_ms: int | None = None  # when the barrier read was announced: now - data_ts_ms is its staleness
    lease: Lease | None = None
    _lineage: bool = False

    @property
    def lease_id(self) -> str | None:
        return self.lease.lease_id if self.lease is not None else None

    def check_lease(self) -> None:
        """Raise ``SnapshotError`` if this snapshot's lease has lapsed (see the module)."""
        if self.lease is not None:
            self.lease.check()

    def table(self, name: str) -> DataFrame:
        """The table at this snapshot's version (``read-uncommitted``: its latest version)."""
        self.check_lease()
        if name not in self.versions:
            raise SnapshotError(f"table {name!r} is not part of this snapshot (opened for {', '.join(self.versions)}); "
                                "open the snapshot with it, or with tables=None for every table")
        version = self.versions[name]
        path = self.path(name)
        try:
            frame = read_version(self.spark, path, version)
        except AnalysisException as exc:
            if version is not None and ("version" in str(exc).lower() or "PATH_NOT_FOUND" in str(exc)):
                raise SnapshotError(
                    f"table {name!r} version {version} (barrier {self.barrier}) is no longer available: it was vacuumed "
                    "or its log expired; read a newer barrier, or hold a repeatable-read lease while reading") from exc
            raise SnapshotError(f"cannot read table {name!r} at {path}: {spark_error(exc)}") from exc
        return frame.select(*[c for c in frame.columns if not c.startswith(HIDDEN)])

    def path(self, name: str) -> str:
        """Where the Delta table ``name`` lives."""
        return self.settings.table_location(name)

    def pin_latest(self) -> None:
        """Fix each table still read at its latest version (``read-uncommitted``) to the version
        that is newest now, so every later ``table``/``sql`` call of this snapshot reads the same
        rows. The tables may still be at different barriers: that is what the level allows."""
        self.versions = {name: latest_version(self.spark, self.path(name)) if version is None else version
                         for name, version in self.versions.items()}

    def sql(self, query: str) -> DataFrame:
        """Run ``query`` with every table it names bound to this snapshot's version (lineage
        tables ``__meta_*`` as they are now)."""
        tree = sqlglot.parse_one(query, read=SPARK)
        ctes = {cte.alias for cte in tree.find_all(exp.CTE)}
        views: dict[str, str] = {}
        for node in list(tree.find_all(exp.Table)):
            name = node.name
            if is_meta_table(name) and not self._lineage:
                register_lineage_views(self.spark, self.settings)
                self._lineage = True
            if name in ctes or is_meta_table(name):
                continue
            if name not in views:
                views[name] = f"{HIDDEN}{name}_b{self.barrier}_v{self.versions.get(name)}_{uuid.uuid4().hex[:6]}"
                self.table(name).createOrReplaceTempView(views[name])
            alias = node.alias or name
            node.replace(exp.Table(this=exp.to_identifier(views[name]), alias=exp.TableAlias(this=exp.to_identifier(alias))))
        return self.spark.sql(tree.sql(dialect=SPARK))

    def close(self) -> None:
        """Release the lease (repeatable-read); the snapshot's DataFrames stay usable until vacuum."""
        if self.lease is not None:
            self.lease.close()

    def __enter__(self) -> ConsistentSnapshot:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def open_snapshot(
    spark: SparkSession,
    tables: Sequence[str] | None = None,
    consistency: str = ReadLevel.READ_COMMITTED,
    as_of_barrier: int | None = None,
    as_of_timestamp: int | None = None,
    settings: Settings | None = None,
    lease_ttl_ms: int = 30_000,
) -> ConsistentSnapshot:
    """Open a snapshot of ``tables`` (None: every registered table) at the read level.

    ``as_of_timestamp`` is epoch milliseconds: the newest barrier announced at or before it.
    Raises SnapshotError for an unknown table, no exact point at the barrier, or an
    unreachable coordinator (naming its URL).
    """
    settings = settings or Settings.from_env()
    pinned, lease = pin_for_read(settings, tables, consistency, as_of_barrier, as_of_timestamp, lease_ttl_ms)
    return ConsistentSnapshot(spark, settings, consistency, pinned.barrier, dict(pinned.versions), pinned.data_ts_ms, lease)
