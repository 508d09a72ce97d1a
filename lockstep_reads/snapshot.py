"""Consistent reads: the coordinator pins each table's Delta version for the read level
(``coordinator.client.snapshots``), and an engine reads those versions. The one front door for
every reader in Python: ``open_snapshot``. By default delta-rs opens the versions and DataFusion
runs the SQL (PostgreSQL's dialect) in this process, in milliseconds, returning Arrow tables: no
JVM starts and pyspark is not imported. Given ``spark=session``, Spark reads them (Spark SQL,
DataFrames: ``lockstep_reads.spark``). The read levels mean what they mean everywhere
(docs/reads.md), and so do the lease and the errors, whichever engine reads.

Example::

    from lockstep_reads import open_snapshot

    with open_snapshot(["user_item_amount", "user_item_price"]) as snap:      # read-committed
        rows = snap.sql("SELECT a.user_id, a.item_id, p.total_price / a.total_amount AS unit_price "
                        "FROM user_item_amount a JOIN user_item_price p USING (user_id, item_id)")
        print(snap.barrier, snap.versions, rows.num_rows)   # a pyarrow.Table; rows.to_pandas()

    with open_snapshot(["user_item_amount"], spark=spark) as snap:            # the same, in Spark
        snap.sql("SELECT SUM(total_amount) FROM user_item_amount").show()

``repeatable-read`` also holds a lease on the versions while the snapshot is open (renewed, and
released by ``close``; it expires on its own if the process dies), so vacuum keeps them; if the
renewals fail for longer than its ttl, the next read raises ``SnapshotError``. ``read-uncommitted``
fixes each table's newest version when the snapshot opens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

import pyarrow as pa
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

from coordinator.client.snapshots import Lease, Pinned, SnapshotError, pin, pin_for_read
from coordinator.client.state import lineage_tables
from coordinator.domain.snapshot import ReadLevel
from coordinator.settings import Settings
from lockstep_reads.engine import run_query
from lockstep_reads.statements import Statement, StatementError, lineage_named, split, tables_named
from lockstep_reads.tables import TableVersions, VersionGone

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

RETRIES = 3  # read-committed reads whose version was vacuumed under them try a newer barrier this often
_versions: dict[tuple[str | None, str | None], TableVersions] = {}


def versions_for(settings: Settings) -> TableVersions:
    """This process's opened table versions for ``settings``' object store (shared by every snapshot)."""
    key = (settings.s3.endpoint, settings.s3.access_key)
    if key not in _versions:
        _versions[key] = TableVersions(settings)
    return _versions[key]


def one_query(sql: str | Statement) -> Any:
    """The query tree of ``sql`` (parsed already if a ``Statement``), one read-only statement."""
    statements = [sql] if isinstance(sql, Statement) else split(sql)
    if len(statements) != 1:
        raise StatementError(f"give one statement, not {len(statements)}")
    return statements[0].require_query()


R = TypeVar("R")  # what an engine's reads return: a pyarrow.Table, a Spark DataFrame
R_co = TypeVar("R_co", covariant=True)


class Engine(Protocol[R_co]):
    """What reads a snapshot's versions: ``ArrowEngine`` here, ``lockstep_reads.spark.SparkEngine``."""

    def newest(self, snap: Snapshot[Any], name: str) -> int:
        """The newest version of ``name`` now (what read-uncommitted fixes)."""
        ...

    def table(self, snap: Snapshot[Any], name: str) -> R_co:
        """The whole table at its version in ``snap`` (its visible columns)."""
        ...

    def sql(self, snap: Snapshot[Any], query: str) -> R_co:
        """``query`` with every table it names at its version in ``snap``."""
        ...


class ArrowEngine:
    """delta-rs and DataFusion in this process: Arrow tables, PostgreSQL's dialect."""

    def newest(self, snap: Snapshot[Any], name: str) -> int:
        return int(snap.open(name).version())

    def table(self, snap: Snapshot[Any], name: str) -> pa.Table:
        return self.sql(snap, f'SELECT * FROM "{name}"')

    def sql(self, snap: Snapshot[Any], query: str) -> pa.Table:
        tree = one_query(query)
        tables = {name: snap.open(name) for name in tables_named(tree)}
        lineage = lineage_tables(snap.settings) if lineage_named(tree) else None
        return run_query(query, tables, lineage)


@dataclass
class Snapshot(Generic[R]):
    """Tables at the versions of one barrier; ``sql`` and ``table`` return what the engine reads
    (Arrow tables, or DataFrames with Spark). ``close`` (or the ``with`` block's end) releases a
    repeatable-read lease."""

    settings: Settings
    level: str
    barrier: int | None
    versions: dict[str, int | None]
    data_ts_ms: int | None = None  # when the barrier read was announced: now - data_ts_ms is its staleness
    leases: list[Lease] = field(default_factory=list)  # repeatable-read: one per set of tables pinned
    engine: Engine[R] = field(default_factory=ArrowEngine)

    @classmethod
    def of(cls, settings: Settings, pinned: Pinned, lease: Lease | None = None,
           engine: Engine[R] | None = None) -> Snapshot[R]:
        snap = cls(settings, pinned.level, pinned.barrier, dict(pinned.versions), pinned.data_ts_ms,
                   [lease] if lease is not None else [], engine or ArrowEngine())
        snap._fix_newest()
        return snap

    def _fix_newest(self) -> None:
        for name, version in self.versions.items():
            if version is None:  # read-uncommitted: each table's newest version now, then fixed
                self.versions[name] = self.engine.newest(self, name)

    @property
    def lease_id(self) -> str | None:
        return self.leases[0].lease_id if self.leases else None

    def check_lease(self) -> None:
        """Raise ``SnapshotError`` if a repeatable-read lease has lapsed (see the module)."""
        for lease in self.leases:
            lease.check()

    def extend(self, tables: Sequence[str]) -> None:
        """Add ``tables`` to this snapshot at its barrier (a repeatable-read snapshot holds a
        lease on them too): ``SnapshotError`` if one has no exact point at that barrier."""
        new = [t for t in tables if t not in self.versions]
        if not new:
            return
        if self.barrier is None:
            pinned = pin(self.settings, new, self.level)
        else:
            pinned = dataclasses.replace(pin(self.settings, new, ReadLevel.READ_COMMITTED, self.barrier),
                                         level=self.level)
        if self.leases:
            self.leases.append(Lease.take(self.settings, pinned, self.leases[0].ttl_ms))
        self.versions |= pinned.versions
        self._fix_newest()

    def location(self, name: str) -> str:
        """Where the Delta table ``name`` lives (``LOCKSTEP_WAREHOUSE``, as for the jobs)."""
        return self.settings.table_location(name)

    def pinned(self, names: Sequence[str]) -> dict[str, tuple[str, int | None]]:
        """Where each of ``names`` lives and its version in this snapshot (``SnapshotError`` for a
        table it does not hold, or a lease that lapsed): what another process opens to read it."""
        self.check_lease()
        missing = [n for n in names if n not in self.versions]
        if missing:
            raise SnapshotError(f"table {missing[0]!r} is not part of this snapshot (opened for "
                                f"{', '.join(self.versions)}); open the snapshot with it, or with tables=None for "
                                "every table")
        return {n: (self.location(n), self.versions[n]) for n in names}

    def open(self, name: str) -> Any:
        """The ``deltalake.DeltaTable`` of ``name`` at this snapshot's version (a changelog table's
        rows as stored: ``sql`` and ``table`` keep each key's newest row, as every reader does)."""
        self.pinned([name])
        try:
            return versions_for(self.settings).open(self.location(name), self.versions[name], name)
        except VersionGone as exc:
            raise VersionGone(f"{exc}; barrier {self.barrier}: read a newer barrier, or hold a repeatable-read "
                              "lease while reading") from exc

    def sql(self, query: str) -> R:
        """Run ``query`` (one query: PostgreSQL's dialect, or Spark SQL with Spark) with every
        table it names at this snapshot's version, and lineage tables (``__meta_*``) as they are now."""
        return self.engine.sql(self, query)

    def table(self, name: str) -> R:
        """The whole table at this snapshot's version (its visible columns)."""
        return self.engine.table(self, name)

    def close(self) -> None:
        """Release the leases (repeatable-read)."""
        while self.leases:
            self.leases.pop().close()

    def __enter__(self) -> Snapshot[R]:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


@overload
def open_snapshot(tables: Sequence[str] | None = None, consistency: str = ReadLevel.READ_COMMITTED,
                  as_of_barrier: int | None = None, as_of_timestamp: int | None = None,
                  settings: Settings | None = None, lease_ttl_ms: int = 30_000, *,
                  spark: None = None) -> Snapshot[pa.Table]: ...


@overload
def open_snapshot(tables: Sequence[str] | None = None, consistency: str = ReadLevel.READ_COMMITTED,
                  as_of_barrier: int | None = None, as_of_timestamp: int | None = None,
                  settings: Settings | None = None, lease_ttl_ms: int = 30_000, *,
                  spark: SparkSession) -> Snapshot[DataFrame]: ...


def open_snapshot(
    tables: Sequence[str] | None = None,
    consistency: str = ReadLevel.READ_COMMITTED,
    as_of_barrier: int | None = None,
    as_of_timestamp: int | None = None,
    settings: Settings | None = None,
    lease_ttl_ms: int = 30_000,
    *,
    spark: SparkSession | None = None,
) -> Snapshot[Any]:
    """Open a snapshot of ``tables`` (None: every registered table) at the read level, read by
    DataFusion (Arrow tables), or by ``spark`` if given (DataFrames, Spark SQL).

    ``as_of_timestamp`` is epoch milliseconds: the newest barrier announced at or before it.
    Raises ``SnapshotError`` (unknown table, no exact point at the barrier, a table this path
    cannot read) or ``CoordinatorUnreachable`` naming the URL; a lease taken is released if the
    snapshot cannot open.
    """
    settings = settings or Settings.from_env(kafka=False)
    engine: Engine[Any] = ArrowEngine()
    if spark is not None:
        from lockstep_reads.spark import SparkEngine  # only a Spark read imports pyspark

        engine = SparkEngine(spark)
    pinned, lease = pin_for_read(settings, tables, consistency, as_of_barrier, as_of_timestamp, lease_ttl_ms)
    try:
        return Snapshot.of(settings, pinned, lease, engine)
    except BaseException:
        if lease is not None:
            lease.close()
        raise


@dataclass(frozen=True)
class Result:
    """A query's rows and what it read: the barrier (None: read-uncommitted) and each table's version."""

    table: pa.Table
    barrier: int | None
    versions: dict[str, int | None]
    data_ts_ms: int | None = None


def query(sql: str | Statement, consistency: str = ReadLevel.READ_COMMITTED, as_of_barrier: int | None = None,
          as_of_timestamp: int | None = None, settings: Settings | None = None, limit: int | None = None) -> Result:
    """Run one query over the tables it names, at one snapshot of the read level (at most
    ``limit`` rows). ``sql`` may be a ``Statement`` parsed already (``statements.split``).

    A read-committed read whose version is vacuumed while it reads tries again at the newest
    barrier (up to ``RETRIES`` times); a read of a pinned past raises ``SnapshotError``.

    Example::

        result = query("SELECT page, views FROM views_per_page ORDER BY views DESC LIMIT 3")
        print(result.barrier, result.table.to_pandas())
    """
    settings = settings or Settings.from_env(kafka=False)
    tree = one_query(sql)
    names = tables_named(tree)
    sql = sql.text if isinstance(sql, Statement) else sql
    lineage = lineage_tables(settings) if lineage_named(tree) else None
    if not names:
        return Result(run_query(sql, {}, lineage, limit), None, {})
    retry = consistency == ReadLevel.READ_COMMITTED and as_of_barrier is None and as_of_timestamp is None

    def read() -> Result:
        with open_snapshot(names, consistency, as_of_barrier, as_of_timestamp, settings) as snap:
            return Result(run_query(sql, {n: snap.open(n) for n in names}, lineage, limit), snap.barrier,
                          dict(snap.versions), snap.data_ts_ms)

    return Retrying(retry=retry_if_exception_type(VersionGone), reraise=True,
                    stop=stop_after_attempt(RETRIES + 1 if retry else 1))(read)
