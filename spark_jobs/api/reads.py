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

import getpass
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

import sqlglot
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from sqlglot import exp

from coordinator.client.commands import CommandClient, new_request_id
from coordinator.client.rest import get_json
from coordinator.domain import AcquireLease, ReleaseLease
from coordinator.domain.errors import LockstepError, Unreachable
from coordinator.domain.snapshot import ReadLevel
from coordinator.settings import Settings
from coordinator.spark_sql import SPARK
from spark_jobs.api.lineage import is_meta_table, register_lineage_views
from spark_jobs.planning.pipeline import tables_read
from spark_jobs.planning.plans import HIDDEN
from spark_jobs.runtime.delta_log import latest_version, read_version
from spark_jobs.runtime.session import spark_error

log = logging.getLogger(__name__)
_clients: dict[tuple[str, str], CommandClient] = {}


def _client(settings: Settings) -> CommandClient:
    """One command client per coordinator for this process: leases of many snapshots share it."""
    key = (settings.bootstrap, settings.topic_prefix)
    if key not in _clients:
        _clients[key] = CommandClient(settings)
    return _clients[key]


def close_clients() -> None:
    """Close the command clients snapshots opened (before the broker they talk to goes away)."""
    while _clients:
        _clients.popitem()[1].close()


class SnapshotError(LockstepError):
    """A consistent read is not possible; the message says why and what to do."""


class CoordinatorUnreachable(SnapshotError, Unreachable):
    """The coordinator did not answer; the message names its URL."""


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
    lease_id: str | None = None
    lease_ttl_ms: int = 30_000
    _stop: threading.Event = field(default_factory=threading.Event)
    _renewer: threading.Thread | None = None
    _lineage: bool = False
    _held_until: float = float("inf")  # monotonic time the lease surely holds until (repeatable-read)
    _renewal_error: str = ""

    def check_lease(self) -> None:
        """Raise ``SnapshotError`` if this snapshot's lease has lapsed (see the module)."""
        if self.lease_id is None or time.monotonic() <= self._held_until:
            return
        why = f"its renewals failed: {self._renewal_error}" if self._renewal_error else "it was not renewed in time"
        raise SnapshotError(
            f"the repeatable-read lease {self.lease_id} on barrier {self.barrier} lapsed "
            f"{time.monotonic() - self._held_until:.0f} s ago ({why}); vacuum may have deleted files this snapshot "
            "reads: open a new snapshot")

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

    def _renew(self) -> None:
        """Renew every third of the ttl until closed or lapsed (a renewal that comes too late
        protects nothing: vacuum may have run in between)."""
        while not self._stop.wait(self.lease_ttl_ms / 3000) and time.monotonic() <= self._held_until:
            try:
                self._acquire()
            except Exception as exc:  # noqa: BLE001 - a missed renewal is retried; the lease has 3x slack
                self._renewal_error = str(exc).splitlines()[0]

    def _acquire(self) -> None:
        """Take or renew the lease; only an answer that comes while it still holds extends it."""
        assert self.lease_id is not None and self.barrier is not None
        holder = f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}"
        sent = time.monotonic()
        outcome = _client(self.settings).emit(AcquireLease(new_request_id(), self.lease_id, holder, tuple(self.versions),
                                                   self.barrier, self.lease_ttl_ms),
                                              timeout=max(self.lease_ttl_ms / 3000, 1.0))
        if not outcome.accepted:
            raise SnapshotError(f"the coordinator refused the lease: {outcome.reason}")
        if time.monotonic() <= self._held_until:
            self._held_until = sent + self.lease_ttl_ms / 1000

    def close(self) -> None:
        """Release the lease (repeatable-read); the snapshot's DataFrames stay usable until vacuum."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(10)
        if self.lease_id is not None:
            try:
                _client(self.settings).emit(ReleaseLease(new_request_id(), self.lease_id), timeout=5)
            except LockstepError as exc:  # it expires on its own after its ttl
                log.warning("could not release lease %s (it expires by itself): %s", self.lease_id, exc)
            self.lease_id = None

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
    if consistency not in tuple(ReadLevel):
        raise SnapshotError(f"unknown consistency {consistency!r}: use one of {', '.join(ReadLevel)}")
    try:
        names = list(tables) if tables is not None else list(get_json(settings, "/topology")["tables"])
        query: dict[str, Any] = {"tables": ",".join(names), "level": consistency}
        if as_of_barrier is not None:
            query["as_of_barrier"] = as_of_barrier
        if as_of_timestamp is not None:
            query["as_of_timestamp"] = as_of_timestamp
        answer = get_json(settings, f"/snapshot?{urlencode(query)}")
    except Unreachable as exc:
        raise CoordinatorUnreachable(str(exc)) from exc
    if "error" in answer:
        raise SnapshotError(answer["error"])
    snapshot = ConsistentSnapshot(spark, settings, consistency, answer["barrier"], answer["versions"],
                                  answer.get("data_ts_ms"), lease_ttl_ms=lease_ttl_ms)
    if consistency == ReadLevel.REPEATABLE_READ and as_of_barrier is None and as_of_timestamp is None:
        snapshot.lease_id = f"rr-{uuid.uuid4().hex[:12]}"
        snapshot._acquire()
        snapshot._renewer = threading.Thread(target=snapshot._renew, name=f"lease-{snapshot.lease_id}", daemon=True)
        snapshot._renewer.start()
    return snapshot
