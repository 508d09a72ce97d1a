"""What every consistent reader shares, whatever engine then reads the files: the coordinator's
answer to "which Delta version of each table, and where" (``pin``), and the repeatable-read
lease that keeps those versions from vacuum (``Lease``).

A read is two steps: ask the coordinator for a barrier and each table's version (the read
levels: docs/reads.md), then read those Delta versions with any engine.
``lockstep_reads.open_snapshot`` does the first step here whichever engine reads (DataFusion or
Spark), and so does ``lockstep serve``, so a level means the same everywhere.

Example::

    pinned = pin(settings, ["user_item_amount", "user_item_price"], "repeatable-read")
    with Lease.take(settings, pinned) as lease:   # renewed in the background until closed
        ...   # read settings.table_location(t) at pinned.versions[t]; lease.check() before each read
"""

from __future__ import annotations

import getpass
import logging
import os
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

from coordinator.client.commands import CommandClient, new_request_id
from coordinator.client.rest import get_json
from coordinator.domain import AcquireLease, ReleaseLease
from coordinator.domain.errors import LockstepError, Unreachable
from coordinator.domain.snapshot import ReadLevel
from coordinator.settings import Settings

log = logging.getLogger(__name__)
_clients: dict[tuple[str, str], CommandClient] = {}
_clients_lock = threading.Lock()


class SnapshotError(LockstepError):
    """A consistent read is not possible; the message says why and what to do."""


class CoordinatorUnreachable(SnapshotError, Unreachable):
    """The coordinator did not answer; the message names its URL."""


def command_client(settings: Settings) -> CommandClient:
    """One command client per coordinator for this process: the leases of many snapshots share it."""
    key = (settings.bootstrap, settings.topic_prefix)
    with _clients_lock:
        if key not in _clients:
            _clients[key] = CommandClient(settings)
        return _clients[key]


def close_clients() -> None:
    """Close the command clients leases opened (before the broker they talk to goes away)."""
    with _clients_lock:
        while _clients:
            _clients.popitem()[1].close()


@dataclass(frozen=True)
class Pinned:
    """The coordinator's answer for one read: the barrier (None at read-uncommitted), each
    table's version (None: its newest), and when the barrier was announced, so
    ``now - data_ts_ms`` is the read's staleness. Where each table lives is the reader's
    ``Settings.table_location``, as for the jobs that write it."""

    level: str
    barrier: int | None
    versions: dict[str, int | None]
    data_ts_ms: int | None = None


def pin(settings: Settings, tables: Sequence[str] | None, level: str = ReadLevel.READ_COMMITTED,
        as_of_barrier: int | None = None, as_of_timestamp: int | None = None) -> Pinned:
    """Ask the coordinator which version of each of ``tables`` (None: every registered table)
    the read level picks. Raises ``SnapshotError`` (unknown table, no common exact point, a
    bad level) or ``CoordinatorUnreachable`` naming the URLs tried."""
    if level not in tuple(ReadLevel):
        raise SnapshotError(f"unknown consistency {level!r}: use one of {', '.join(ReadLevel)}")
    try:
        names = list(tables) if tables is not None else list(get_json(settings, "/topology")["tables"])
        query: dict[str, Any] = {"tables": ",".join(names), "level": level}
        if as_of_barrier is not None:
            query["as_of_barrier"] = as_of_barrier
        if as_of_timestamp is not None:
            query["as_of_timestamp"] = as_of_timestamp
        answer = get_json(settings, f"/snapshot?{urlencode(query)}")
    except Unreachable as exc:
        raise CoordinatorUnreachable(str(exc)) from exc
    if "error" in answer:
        raise SnapshotError(answer["error"])
    return Pinned(level, answer["barrier"], answer["versions"], answer.get("data_ts_ms"))


def pin_for_read(settings: Settings, tables: Sequence[str] | None, level: str, as_of_barrier: int | None = None,
                 as_of_timestamp: int | None = None, lease_ttl_ms: int = 30_000) -> tuple[Pinned, Lease | None]:
    """``pin``, and the lease the level takes (repeatable-read of the present): what every
    reader's ``open_snapshot`` does first, whatever engine reads the versions then."""
    pinned = pin(settings, tables, level, as_of_barrier, as_of_timestamp)
    lease = Lease.take(settings, pinned, lease_ttl_ms) if takes_lease(level, as_of_barrier, as_of_timestamp) else None
    return pinned, lease


def takes_lease(level: str, as_of_barrier: int | None = None, as_of_timestamp: int | None = None) -> bool:
    """Repeatable-read of the present holds a lease; reads of the past and the other levels do not.

    >>> takes_lease("repeatable-read"), takes_lease("repeatable-read", as_of_barrier=3), takes_lease("read-committed")
    (True, False, False)
    """
    return level == ReadLevel.REPEATABLE_READ and as_of_barrier is None and as_of_timestamp is None


class Lease:
    """A repeatable-read hold on the versions of one barrier: taken at once, renewed every third
    of its ttl in a background thread, released by ``close``, and expiring on its own after its
    ttl if the process dies. If the renewals fail for longer than the ttl (the coordinator or
    broker unreachable), ``check`` raises ``SnapshotError``: vacuum may have deleted what the
    snapshot reads."""

    def __init__(self, settings: Settings, barrier: int, tables: Sequence[str], ttl_ms: int = 30_000,
                 holder: str | None = None) -> None:
        self.settings = settings
        self.barrier = barrier
        self.tables = tuple(tables)
        self.ttl_ms = ttl_ms
        self.lease_id = f"rr-{uuid.uuid4().hex[:12]}"
        self._secret = secrets.token_hex(16)  # proves this holder to the coordinator; shown nowhere
        self.holder = holder or f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}"
        self._held_until = float("inf")  # monotonic time the lease surely holds until
        self._renewal_error = ""
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.released = False

    @classmethod
    def take(cls, settings: Settings, pinned: Pinned, ttl_ms: int = 30_000, holder: str | None = None) -> Lease:
        """Take a lease on ``pinned``'s versions and start renewing it (``SnapshotError`` if refused)."""
        if pinned.barrier is None:
            raise SnapshotError("a lease holds the versions of one barrier; this read has none (read-uncommitted)")
        lease = cls(settings, pinned.barrier, list(pinned.versions), ttl_ms, holder)
        lease._acquire()
        lease._renewer = threading.Thread(target=lease._renew, name=f"lease-{lease.lease_id}", daemon=True)
        lease._renewer.start()
        return lease

    def check(self) -> None:
        """Raise ``SnapshotError`` if this lease has lapsed or was released."""
        if self.released:
            raise SnapshotError(f"the repeatable-read lease {self.lease_id} on barrier {self.barrier} was released; "
                                "open a new snapshot")
        if time.monotonic() <= self._held_until:
            return
        why = f"its renewals failed: {self._renewal_error}" if self._renewal_error else "it was not renewed in time"
        raise SnapshotError(
            f"the repeatable-read lease {self.lease_id} on barrier {self.barrier} lapsed "
            f"{time.monotonic() - self._held_until:.0f} s ago ({why}); vacuum may have deleted files this snapshot "
            "reads: open a new snapshot")

    def _renew(self) -> None:
        """Renew every third of the ttl until closed or lapsed (a renewal that comes too late
        protects nothing: vacuum may have run in between)."""
        while not self._stop.wait(self.ttl_ms / 3000) and time.monotonic() <= self._held_until:
            try:
                self._acquire()
            except Exception as exc:  # noqa: BLE001 - a missed renewal is retried; the lease has 3x slack
                self._renewal_error = str(exc).splitlines()[0]

    def _acquire(self) -> None:
        """Take or renew the lease; only an answer that comes while it still holds extends it."""
        sent = time.monotonic()
        try:
            outcome = command_client(self.settings).emit(
                AcquireLease(new_request_id(), self.lease_id, self.holder, self.tables, self.barrier, self.ttl_ms,
                             self._secret),
                timeout=max(self.ttl_ms / 3000, 1.0))
        except Unreachable as exc:
            raise CoordinatorUnreachable(str(exc)) from exc
        if not outcome.accepted:
            raise SnapshotError(f"the coordinator refused the lease: {outcome.reason}")
        if time.monotonic() <= self._held_until:
            self._held_until = sent + self.ttl_ms / 1000

    def close(self) -> None:
        """Stop renewing and release the lease (it expires by itself after its ttl if this fails)."""
        if self.released:
            return
        self.released = True
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join(10)
        try:
            command_client(self.settings).emit(ReleaseLease(new_request_id(), self.lease_id, self._secret), timeout=5)
        except LockstepError as exc:
            log.warning("could not release lease %s (it expires by itself): %s", self.lease_id, exc)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
