"""Reads FLIP-276's join of ``user_item_amount`` and ``user_item_price`` at each read level and
counts the rows whose average price is not the item's unit price: numbers that never existed.

``lockstep demo`` and the consistency tests both use it. A prober without a Spark session reads
the light way (delta-rs and DataFusion in this process, no JVM); with one, through Spark, for
comparison (both ``lockstep_reads.open_snapshot``); with a ``dsn``, through ``lockstep serve`` as
any PostgreSQL client would (a transaction at the level per read).

Example::

    prober = Prober(None, settings)    # light; Prober(spark, settings) reads through Spark
    prober.read("read-committed")      # one snapshot, one join, anomalies counted
    prober.stats["read-committed"].anomalous_reads   # 0
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession

from coordinator.client.snapshots import CoordinatorUnreachable, SnapshotError
from coordinator.domain.delays import percentile
from coordinator.domain.snapshot import ReadLevel
from coordinator.settings import Settings
from lockstep_reads.snapshot import open_snapshot
from spark_jobs.demo.datagen import unit_price

TABLES = ("user_item_amount", "user_item_price")
FLIP_JOIN = ("SELECT a.user_id, a.item_id, a.total_amount, p.total_price, p.total_price / a.total_amount AS avg_price "
             "FROM user_item_amount a JOIN user_item_price p ON a.user_id = p.user_id AND a.item_id = p.item_id")
MEMO_SIZE = 16  # sets of versions whose rows a memoising Prober keeps


def wrong_prices(rows: list[Any]) -> int:
    """Rows of FLIP_JOIN whose average price differs from the item's unit price.

    >>> wrong_prices([{"item_id": 0, "avg_price": 1.0}, {"item_id": 1, "avg_price": 1.2}])
    1
    """
    return sum(1 for r in rows if abs(r["avg_price"] - unit_price(r["item_id"])) > 1e-9 * unit_price(r["item_id"]))


@dataclass
class LevelStats:
    """What the reads at one level saw. Staleness = when the rows were in hand minus when the
    barrier they belong to was announced (read-uncommitted: an upper bound)."""

    reads: int = 0
    evaluated: int = 0  # reads whose join ran (the others read versions read before)
    anomalous_reads: int = 0
    anomalous_rows: int = 0
    rows: int = 0
    staleness_ms: list[int] = field(default_factory=list)
    barriers: set[int] = field(default_factory=set)
    waiting: int = 0  # snapshots not possible yet (no common exact point)
    last_error: str = ""

    def staleness(self, p: float) -> int | None:
        return percentile(self.staleness_ms, p)


@dataclass
class Prober:
    """Runs FLIP_JOIN at a level per ``read``, through Spark if ``spark`` is a session, else the
    light way. With ``memo`` the join at one set of versions is evaluated once and reused:
    Delta versions never change, so a later read of the same versions returns the same rows.
    Read-uncommitted then pins each table's newest version at the time of the read, so it is
    memoised the same way. A reader that asks often thus costs work only when there is
    something new to read."""

    spark: SparkSession | None
    settings: Settings
    memo: bool = False
    dsn: str | None = None  # read through lockstep serve (psycopg) instead
    _served: Any = None
    stats: dict[str, LevelStats] = field(default_factory=lambda: {level: LevelStats() for level in ReadLevel})
    evaluated: int = 0
    _memo: dict[Any, list[Any]] = field(default_factory=dict)  # versions read -> the join's rows

    def read(self, level: str) -> bool:
        """One read at ``level``; False if no snapshot was possible yet (counted as waiting).
        Raises CoordinatorUnreachable."""
        stats = self.stats[level]
        if self.dsn is not None:
            return self._read_served(level, stats)
        try:
            snap: Any = open_snapshot(TABLES, level, settings=self.settings, spark=self.spark)
            with snap:
                key = tuple(sorted(snap.versions.items())) if self.memo else None
                rows = self._memo.get(key) if key is not None else None
                if rows is None:
                    rows = self._join(snap)
                    self.evaluated += 1
                    stats.evaluated += 1
                    if key is not None:
                        self._remember(key, rows)
                if snap.data_ts_ms is not None:
                    stats.staleness_ms.append(int(time.time() * 1000) - snap.data_ts_ms)
                if snap.barrier is not None:
                    stats.barriers.add(snap.barrier)
        except CoordinatorUnreachable:
            raise
        except SnapshotError as exc:
            stats.waiting += 1
            stats.last_error = str(exc)
            return False
        self._count(stats, rows)
        return True

    @staticmethod
    def _count(stats: LevelStats, rows: list[Any]) -> None:
        wrong = wrong_prices(rows)
        stats.reads += 1
        stats.rows += len(rows)
        stats.anomalous_rows += wrong
        stats.anomalous_reads += wrong > 0

    def _read_served(self, level: str, stats: LevelStats) -> bool:
        """One read through ``lockstep serve``: the join in a transaction at the level (SQL's
        names for the levels), then what the server says it read. With ``memo`` a statement
        that reads no rows pins the snapshot first, and the join runs only for versions not read
        before (at read-uncommitted the join may then read newer versions: its rows are kept
        under the versions it read)."""
        import psycopg
        from psycopg.rows import dict_row

        if self._served is None or self._served.closed:
            self._served = psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row)
        conn = self._served
        try:
            with conn.transaction():
                conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level.replace('-', ' ').upper()}")
                rows = None
                if self.memo:
                    conn.execute(f"{FLIP_JOIN} LIMIT 0")  # pins this read's snapshot, reads no rows
                    rows = self._memo.get(self._served_versions(conn))
                if rows is None:
                    rows = conn.execute(FLIP_JOIN).fetchall()
                    self.evaluated += 1
                    stats.evaluated += 1
                    if self.memo:
                        self._remember(self._served_versions(conn), rows)
                read = conn.execute("SHOW lockstep.barrier").fetchone()
                stale = conn.execute("SHOW lockstep.staleness_ms").fetchone()
        except psycopg.Error as exc:
            if exc.sqlstate == "58000":
                raise CoordinatorUnreachable(str(exc)) from exc
            if exc.sqlstate not in ("55000", "42P01"):
                raise
            stats.waiting += 1
            stats.last_error = str(exc).splitlines()[0]
            return False
        if read and read["lockstep.barrier"] is not None:
            stats.barriers.add(int(read["lockstep.barrier"]))
        if stale and stale["lockstep.staleness_ms"] is not None:
            stats.staleness_ms.append(int(stale["lockstep.staleness_ms"]))
        self._count(stats, rows)
        return True

    def _join(self, snap: Any) -> list[dict[str, Any]]:
        if self.spark is not None:
            return [r.asDict() for r in snap.sql(FLIP_JOIN).collect()]
        return snap.sql(FLIP_JOIN).to_pylist()

    @staticmethod
    def _served_versions(conn: Any) -> Any:
        return conn.execute("SHOW lockstep.versions").fetchone()["lockstep.versions"]

    def _remember(self, key: Any, rows: list[Any]) -> None:
        self._memo[key] = rows
        if len(self._memo) > MEMO_SIZE:  # readers move forward: keep the newest few
            del self._memo[next(iter(self._memo))]
