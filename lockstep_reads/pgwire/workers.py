"""Where ``lockstep serve`` runs its queries: worker processes, one statement at a time each.

A DataFusion query cannot be interrupted from another thread (the engine's stream blocks the
thread that asks it for rows until it has some, which for ``count(*)`` over a huge series is
the whole query). So each query runs in a worker process, and a statement past its
``statement_timeout`` or cancelled is really stopped: its process is killed at once and a fresh
one takes its place, while the server and every other connection go on. Rows come back a
batch at a time (Arrow IPC over a pipe), each computed only when the last was taken: the
server holds a few batches per connection, and a client that reads slowly pauses its query.

Example::

    workers = QueryWorkers(settings, count=4)
    job = Job("SELECT * FROM orders", {"orders": (location, 7)})
    with workers.running(workers.take(deadline, lambda: None), job, deadline, lambda: None) as rows:
        rows.start()
        while (batch := rows.next()) is not None:
            send(batch)
    workers.close()
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import pyarrow as pa

from coordinator.client.snapshots import SnapshotError
from coordinator.domain.lineage import LineageTable
from coordinator.settings import Settings
from lockstep_reads.engine import stream_query
from lockstep_reads.statements import QueryError
from lockstep_reads.tables import TableVersions, UnreadableTable, VersionGone

SCHEMA, BATCH, END, FAILED = b"S", b"B", b"E", b"X"
POLL_S = 0.05  # how often a wait for rows looks at its deadline and its cancel flag
ERRORS: dict[str, type[Exception]] = {e.__name__: e for e in (QueryError, VersionGone, UnreadableTable, SnapshotError)}


@dataclass(frozen=True)
class Job:
    """One query: its SQL, each table it reads at a pinned version, and lineage rows."""

    sql: str
    tables: dict[str, tuple[str, int | None]]  # name -> (location, version)
    lineage: dict[str, LineageTable] | None = None


class Stopped(Exception):
    """The statement was stopped: ``why`` is ``timeout`` or ``cancel``."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def serve_jobs(conn: Connection, settings: Settings) -> None:
    """A worker process's life: run each job it is sent, its rows back a batch at a time."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server stops us
    versions = TableVersions(settings)
    while True:
        try:
            job: Job = conn.recv()
        except (EOFError, OSError):
            return  # the server is gone
        try:
            tables = {name: versions.open(location, version, name) for name, (location, version) in job.tables.items()}
            schema, batches = stream_query(job.sql, tables, job.lineage)
            conn.send_bytes(SCHEMA + schema.serialize().to_pybytes())
            for batch in batches:
                conn.send_bytes(BATCH + batch.serialize().to_pybytes())
            conn.send_bytes(END)
        except (EOFError, OSError, BrokenPipeError):
            return
        except Exception as exc:  # noqa: BLE001 - the statement's error goes to its client; the worker lives on
            conn.send_bytes(FAILED + pickle.dumps((type(exc).__name__, str(exc))))


@dataclass(eq=False)
class Worker:
    process: BaseProcess
    conn: Connection


class Rows:
    """A running query's rows (see ``QueryWorkers.running``)."""

    def __init__(self, worker: Worker, deadline: float, stopped: Callable[[], str | None]) -> None:
        self.worker, self.deadline, self.stopped = worker, deadline, stopped
        self.done = False  # the worker said all (or failed): it can take the next job
        self.schema = pa.schema([])
        self._ahead: list[pa.RecordBatch | None] = []  # taken from the pipe already, not yet asked for

    def start(self) -> None:
        """Wait for the query's schema (it is planned by then) and its first batch, or its error:
        a small result is then all here, and ``ready`` says so without a wait."""
        self.schema = pa.ipc.read_schema(pa.py_buffer(self._message()[1:]))
        self._fetch()

    def ready(self) -> bool:
        """Whether ``next`` answers at once (nothing to wait for)."""
        return bool(self._ahead) or self.done

    def _message(self) -> bytes:
        while not self.worker.conn.poll(POLL_S):
            if (why := self.stopped()) is not None:
                raise Stopped(why)
            if time.monotonic() >= self.deadline:
                raise Stopped("timeout")
            if not self.worker.process.is_alive():
                raise QueryError("the query's worker process ended (out of memory?)")
        message = self.worker.conn.recv_bytes()
        if message[:1] == FAILED:
            self.done = True
            kind, text = pickle.loads(message[1:])
            raise ERRORS.get(kind, QueryError)(text)
        return message

    def _take(self, message: bytes) -> None:
        if message[:1] == END:
            self.done = True
        else:
            self._ahead.append(pa.ipc.read_record_batch(pa.py_buffer(message[1:]), self.schema))

    def _fetch(self) -> None:
        """Wait for the next message; take one more if it is there already (often the end)."""
        self._take(self._message())
        if not self.done and self.worker.conn.poll(0):
            self._take(self._message())

    def next(self) -> pa.RecordBatch | None:
        """The next batch (computed now), or None after the last; raises ``Stopped`` past the
        deadline or when ``stopped`` says why, or the query's error."""
        if not self._ahead and not self.done:
            self._fetch()
        return self._ahead.pop(0) if self._ahead else None


class QueryWorkers:
    """``count`` worker processes (see the module), started at once, replaced when killed."""

    def __init__(self, settings: Settings, count: int) -> None:
        self.settings = settings
        self._context = multiprocessing.get_context("spawn")  # a fork would copy the server's threads
        # the worker used last goes first: under light load one worker takes most reads, and the
        # table versions it opened for the last read are still open for the next
        self._idle: queue.LifoQueue[Worker] = queue.LifoQueue()
        self._all: set[Worker] = set()
        self._closed = False
        for _ in range(count):
            self._idle.put(self._spawn())

    def _spawn(self) -> Worker:
        parent, child = self._context.Pipe()
        process = self._context.Process(target=serve_jobs, args=(child, self.settings), name="lockstep-query",
                                        daemon=True)
        process.start()
        child.close()
        worker = Worker(process, parent)
        self._all.add(worker)
        return worker

    def take(self, deadline: float, stopped: Callable[[], str | None]) -> Worker:
        """An idle worker, waiting for one while every one runs a query (the wait counts toward
        the statement's deadline, and a cancel ends it)."""
        while True:
            try:
                return self._idle.get(timeout=POLL_S)
            except queue.Empty:
                if (why := stopped()) is not None:
                    raise Stopped(why) from None
                if time.monotonic() >= deadline:
                    raise Stopped("timeout") from None

    @contextlib.contextmanager
    def running(self, worker: Worker, job: Job, deadline: float, stopped: Callable[[], str | None]) -> Iterator[Rows]:
        """``job`` sent to ``worker`` (from ``take``): its ``Rows`` (``start`` them) until the block
        ends. A query left before its last row (stopped, too large, the client gone) ends with
        its worker, which is replaced."""
        rows = Rows(worker, deadline, stopped)
        try:
            worker.conn.send(job)
            yield rows
        finally:
            if rows.done and worker.process.is_alive():
                self._idle.put(worker)
            else:
                self._replace(worker)

    def _replace(self, worker: Worker) -> None:
        """Kill ``worker`` now; a new one joins the idle ones once it has started (off this thread)."""
        worker.process.kill()
        worker.conn.close()
        self._all.discard(worker)

        def respawn() -> None:
            worker.process.join(10)
            if not self._closed:
                self._idle.put(self._spawn())

        threading.Thread(target=respawn, name="lockstep-query-respawn", daemon=True).start()

    def close(self) -> None:
        """Stop every worker: idle ones end at the end of their pipe, busy ones are killed."""
        self._closed = True
        for worker in list(self._all):
            worker.conn.close()
        for worker in list(self._all):
            worker.process.join(2)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(5)
