"""One client connection's state and what each statement does, with no sockets here: the
transaction block and its read level, session settings and limits, the last read's barrier and
versions. The server (``server.py``) calls ``execute`` for each statement, off its event loop;
a read pins its versions here and is run by a query worker (``workers.py``).

A statement outside a transaction block, or inside one at READ COMMITTED, reads one
read-committed snapshot of the tables it names. ``BEGIN ISOLATION LEVEL REPEATABLE READ`` (or
SERIALIZABLE: a read-only transaction on one snapshot is serializable) pins one barrier at its
first read and holds a lease on what it reads until COMMIT, ROLLBACK or disconnect; READ
UNCOMMITTED reads each table's newest version. ``SET lockstep.as_of_barrier`` and
``lockstep.as_of_timestamp`` read the past; ``SHOW lockstep.barrier`` / ``lockstep.versions``
say what the last read read.

Example::

    session = Session(settings)
    outcome = session.execute(split("SELECT page, views FROM views_per_page")[0])
    outcome.job          # what a query worker runs: the SQL and each table's pinned version
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

import pyarrow as pa

from coordinator.client.snapshots import CoordinatorUnreachable, SnapshotError
from coordinator.client.state import lineage_tables
from coordinator.domain.errors import UnknownTables
from coordinator.domain.snapshot import ReadLevel, epoch_ms
from coordinator.settings import Settings
from lockstep_reads.pgwire import catalog, limits
from lockstep_reads.pgwire.limits import Limits
from lockstep_reads.pgwire.workers import Job
from lockstep_reads.snapshot import Snapshot, open_snapshot
from lockstep_reads.statements import Kind, QueryError, Refused, Statement, StatementError, lineage_named, tables_named
from lockstep_reads.tables import UnreadableTable, VersionGone

SERVER_VERSION, SERVER_VERSION_NUM = "15.0", "150000"  # what psql and drivers adapt their catalog queries to
# what a client is told at start and may SET; reported back when it changes (ParameterStatus)
REPORTED = {"server_version": f"{SERVER_VERSION} (Lockstep)", "server_encoding": "UTF8", "client_encoding": "UTF8",
            "DateStyle": "ISO, MDY", "TimeZone": "UTC", "IntervalStyle": "postgres", "integer_datetimes": "on",
            "standard_conforming_strings": "on", "is_superuser": "off", "session_authorization": "lockstep",
            "application_name": ""}
LEVELS = {"read uncommitted": ReadLevel.READ_UNCOMMITTED, "read committed": ReadLevel.READ_COMMITTED,
          "repeatable read": ReadLevel.REPEATABLE_READ, "serializable": ReadLevel.REPEATABLE_READ}
ISOLATION = re.compile(r"isolation\s+level\s+(read\s+uncommitted|read\s+committed|repeatable\s+read|serializable)", re.I)
SET = re.compile(r"^set\s+(?:session\s+|local\s+)?(?P<name>[\w.]+|time\s+zone)\s*(?:=|\s+to\s+|\s)\s*(?P<value>.*?)\s*$",
                 re.I | re.S)


class SqlError(Exception):
    """What the client gets as an ErrorResponse: a SQLSTATE and a message."""

    def __init__(self, sqlstate: str, text: str, hint: str = "") -> None:
        super().__init__(text)
        self.sqlstate = sqlstate
        self.hint = hint


@dataclass
class Outcome:
    """A statement's result: its CommandComplete tag, rows if it returns any, and parameters
    whose new values the client must be told."""

    tag: str
    table: pa.Table | None = None
    job: Job | None = None  # a read: its rows come from a query worker (``server.py`` streams them)
    reported: dict[str, str] = field(default_factory=dict)
    notice: str = ""


def sql_error(exc: Exception) -> SqlError:
    """The SQLSTATE of each error a read can end in (PostgreSQL's codes for the same situations)."""
    text = str(exc)
    if isinstance(exc, SqlError):
        return exc
    if isinstance(exc, Refused):
        return SqlError("25006", text, "Lockstep's tables are written by its pipelines; clients read them")
    if isinstance(exc, UnknownTables) or (isinstance(exc, SnapshotError) and "unknown table" in text):
        return SqlError("42P01", text)
    if isinstance(exc, UnreadableTable):
        return SqlError("0A000", text)
    if isinstance(exc, VersionGone) or "lease" in text and "lapsed" in text:
        return SqlError("72000", text)
    if isinstance(exc, CoordinatorUnreachable):
        return SqlError("58000", text)
    if isinstance(exc, SnapshotError):
        return SqlError("55000", text)
    if isinstance(exc, QueryError):
        return SqlError("42703" if "No field named" in text else "42P01" if "not found" in text else "42000", text)
    if isinstance(exc, StatementError):
        return SqlError("42601", text)
    return SqlError("XX000", f"{type(exc).__name__}: {text}")


def unquoted(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1].replace(value[0] * 2, value[0])
    return value


class Session:
    """See the module. Not thread-safe: one statement at a time, as the protocol sends them."""

    def __init__(self, settings: Settings, parameters: dict[str, str] | None = None, bounds: Limits | None = None) -> None:
        self.settings = settings
        self.limits = bounds or Limits()
        self.parameters = {**REPORTED, **self.limits.defaults(), **(parameters or {})}
        self.default_level: str = ReadLevel.READ_COMMITTED
        self.in_block = False
        self.failed = False
        self.level: str = ReadLevel.READ_COMMITTED
        self.held: Snapshot | None = None  # the repeatable-read transaction's snapshot, from its first read
        self.read_in_block = False
        self.as_of_barrier: int | None = None
        self.as_of_timestamp: int | None = None
        self.last_read: dict[str, object] = {}

    @property
    def status(self) -> str:
        """ReadyForQuery's transaction status: I idle, T in a block, E in a failed block."""
        return "E" if self.failed else "T" if self.in_block else "I"

    def execute(self, statement: Statement) -> Outcome:
        """Run one statement; raises ``SqlError``. An error inside a block fails the block."""
        try:
            if self.failed and statement.kind not in (Kind.COMMIT, Kind.ROLLBACK):
                raise SqlError("25P02", "current transaction is aborted, commands ignored until end of transaction block")
            return self._run(statement)
        except Exception as exc:
            if self.in_block:
                self.failed = True
            raise sql_error(exc) from exc

    def _run(self, statement: Statement) -> Outcome:
        kind, text = statement.kind, statement.text
        if kind == Kind.BEGIN:
            return self._begin(text)
        if kind in (Kind.COMMIT, Kind.ROLLBACK):
            tag = "ROLLBACK" if kind == Kind.ROLLBACK or self.failed else "COMMIT"
            notice = "" if self.in_block else "there is no transaction in progress"
            self.end_block()
            return Outcome(tag, notice=notice)
        if kind == Kind.SET:
            return self._set(text)
        if kind == Kind.RESET:
            return self._set(re.sub(r"^reset\s+(.*)$", r"set \1 = default", text, flags=re.I | re.S), tag="RESET")
        if kind == Kind.SHOW:
            name = text.split(None, 1)[1].strip().rstrip(";") if len(text.split()) > 1 else ""
            return self._show(name)
        if statement.verb in ("DISCARD", "DEALLOCATE", "CLOSE", "UNLISTEN"):
            return Outcome(statement.verb if statement.verb != "DISCARD" else text.upper().rstrip(";"))
        if kind == Kind.EMPTY:
            return Outcome("")
        tree = statement.require_query()
        answered = catalog.answer(tree, text, self.settings, self.parameters)
        if answered is not None:
            return Outcome(f"SELECT {answered.num_rows}", answered)
        return Outcome("SELECT", job=self._read(statement, tables_named(tree)))

    def _begin(self, text: str) -> Outcome:
        if self.in_block:
            return Outcome("BEGIN", notice="there is already a transaction in progress")
        self.in_block, self.failed, self.read_in_block = True, False, False
        match = ISOLATION.search(text)
        self.level = LEVELS[" ".join(match.group(1).lower().split())] if match else self.default_level
        return Outcome("BEGIN")

    def end_block(self) -> None:
        """Leave the transaction block: its lease (repeatable-read) is released."""
        if self.held is not None:
            self.held.close()
            self.held = None
        self.in_block = self.failed = self.read_in_block = False
        self.level = self.default_level

    def _read(self, statement: Statement, names: list[str]) -> Job:
        """Pin the versions ``statement`` reads (at the session's read level) and say what to run."""
        started = time.time()
        lineage = dict(lineage_tables(self.settings)) if statement.tree is not None and lineage_named(statement.tree) \
            else None
        if not names:
            self.last_read = {"barrier": None, "versions": {}}
            return Job(statement.text, {}, lineage)
        as_of = self.as_of_barrier is not None or self.as_of_timestamp is not None
        level = self.level if self.in_block else self.default_level
        if self.in_block:
            self.read_in_block = True
        if self.in_block and level == ReadLevel.REPEATABLE_READ and not as_of:
            if self.held is None:
                self.held = open_snapshot(names, level, settings=self.settings)
            self.held.extend(names)
            snapshot = self.held
        else:  # a snapshot of this statement alone: it holds no lease, closed at once
            snapshot = open_snapshot(names, level if level != ReadLevel.REPEATABLE_READ else ReadLevel.READ_COMMITTED,
                                     self.as_of_barrier, self.as_of_timestamp, self.settings)
            snapshot.close()
        tables = snapshot.pinned(names)
        self.last_read = {"barrier": snapshot.barrier, "versions": {n: v for n, (_, v) in tables.items()},
                          "staleness_ms": None if snapshot.data_ts_ms is None else
                          int(started * 1000) - snapshot.data_ts_ms}
        return Job(statement.text, tables, lineage)

    def limit(self, name: str) -> int:
        """The session's value of a settable limit (``limits.SETTABLE``): ms, or bytes; 0 is off."""
        value = self.parameters[name]
        return limits.size_bytes(name, value) if name == "max_result_size" else limits.duration_ms(name, value)

    def _set(self, text: str, tag: str = "SET") -> Outcome:
        if re.match(r"^set\s+(session\s+characteristics\s+as\s+)?transaction\b", text, re.I):
            match = ISOLATION.search(text)
            level = LEVELS[" ".join(match.group(1).lower().split())] if match else None
            if level is not None and "characteristics" in text.lower():
                self.default_level = level
            elif level is not None:
                if not self.in_block or self.read_in_block:
                    raise SqlError("25001", "SET TRANSACTION ISOLATION LEVEL must be called before any query, "
                                   "inside a transaction block")
                self.level = level
            return Outcome(tag)
        match = SET.match(text)
        if match is None:
            raise SqlError("42601", f"cannot read {text!r} as SET name = value")
        name = "TimeZone" if match["name"].lower().replace(" ", "") == "timezone" else match["name"]
        value = unquoted(match["value"])
        default = value.lower() in ("default", "") and not match["value"].startswith("'")
        if name.lower().startswith("lockstep."):
            self._set_lockstep(name.lower(), None if default else value)
            return Outcome(tag)
        if name.lower() in limits.SETTABLE:
            name = name.lower()
            try:
                self.parameters[name] = self.limits.defaults()[name] if default else limits.check(name, value)
            except limits.LimitError as exc:
                raise SqlError("22023", str(exc)) from exc
            return Outcome(tag)
        known = {k.lower(): k for k in self.parameters}
        name = known.get(name.lower(), name.lower())
        self.parameters[name] = REPORTED.get(name, "") if default else value
        return Outcome(tag, reported={name: self.parameters[name]} if name in REPORTED else {})

    def _set_lockstep(self, name: str, value: str | None) -> None:
        try:
            if name == "lockstep.as_of_barrier":
                self.as_of_barrier = None if value is None else int(value)
                self.as_of_timestamp = None
                if self.as_of_barrier is not None and self.as_of_barrier < 1:
                    raise ValueError("a barrier is a whole number >= 1")
            elif name == "lockstep.as_of_timestamp":
                self.as_of_timestamp = None if value is None else epoch_ms(value)
                self.as_of_barrier = None
            else:
                raise SqlError("42704", f"unrecognized configuration parameter {name!r}",
                               "Lockstep's are lockstep.as_of_barrier and lockstep.as_of_timestamp")
        except ValueError as exc:
            raise SqlError("22023", f"invalid value for {name}: {exc}") from exc

    def _show(self, name: str) -> Outcome:
        key = " ".join(name.lower().split())
        if key == "transaction isolation level":
            name = key = "transaction_isolation"
        values: dict[str, object] = {
            "lockstep.barrier": self.last_read.get("barrier"),
            "lockstep.versions": json.dumps(self.last_read.get("versions")) if self.last_read else None,
            "lockstep.staleness_ms": self.last_read.get("staleness_ms"),
            "lockstep.as_of_barrier": self.as_of_barrier, "lockstep.as_of_timestamp": self.as_of_timestamp,
            "transaction_isolation": (self.level if self.in_block else self.default_level).replace("-", " "),
            "default_transaction_isolation": self.default_level.replace("-", " "),
            "transaction_read_only": "on", "default_transaction_read_only": "on",
            "server_version_num": SERVER_VERSION_NUM,
        }
        values |= {k.lower(): v for k, v in self.parameters.items()}
        if key not in values:
            raise SqlError("42704", f"unrecognized configuration parameter {name!r}")
        value = values[key]
        column = name if key not in {k.lower() for k in self.parameters} else key
        return Outcome("SHOW", pa.table({column: pa.array([None if value is None else str(value)], pa.string())}))

    def close(self) -> None:
        """The connection ended: release what it holds."""
        self.end_block()
