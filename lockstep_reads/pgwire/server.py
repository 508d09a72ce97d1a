"""``lockstep serve``: Lockstep's tables to any PostgreSQL client (psql, psycopg, JDBC, BI tools).

An asyncio server speaks the protocol's startup, authentication (``auth.py``), simple query and
extended query (Parse, Bind, Describe, Execute, Sync, Close) flows. What a statement does is
decided by its connection's ``Session`` (``session.py``) on a small thread pool; a read's rows are
computed by a query worker process (``workers.py``) and streamed to the socket a batch at a time,
waiting for the client to take each, so a connection holds a few batches however large its
result, and a slow reader pauses its own query. The limits (``limits.py``) hold from the first
byte: a startup deadline, small messages before authentication, a slowed answer to a wrong
password, a statement size cap, ``statement_timeout``, ``max_result_size`` and
``idle_in_transaction_session_timeout``. TLS is not spoken (an SSLRequest is declined, as a server
without certificates does): reach it over loopback, an SSH tunnel or a TLS proxy.

Example::

    server = WireServer(settings, port=5433)
    asyncio.run(server.serve(ready=lambda: print("up")))     # until server.stop()
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from coordinator.settings import Settings
from lockstep_reads.pgwire import messages as m
from lockstep_reads.pgwire.auth import ScramSecret
from lockstep_reads.pgwire.connection import Connection
from lockstep_reads.pgwire.limits import Limits
from lockstep_reads.pgwire.workers import QueryWorkers


class WireServer:
    """See the module. ``trust``: ``loopback`` lets loopback clients in without a password,
    ``none`` asks every client for ``password``. ``workers`` query processes run reads; at most
    ``max_connections`` clients are in at once, and as many more may be starting (their
    startup ends after ``limits.startup_s``; one more makes the oldest of them give way)."""

    def __init__(self, settings: Settings, host: str = "127.0.0.1", port: int = 5433, trust: str = "loopback",
                 password: str = "", max_connections: int = 200, workers: int = 4, limits: Limits | None = None) -> None:
        self.settings, self.host, self.port, self.trust = settings, host, port, trust
        self.secret = ScramSecret.of(password) if password else None
        self.max_connections, self.worker_count = max_connections, workers
        self.limits = limits or Limits()
        # a session's decisions, parsing, the wait for a query worker; then the waits for rows
        self.pool = ThreadPoolExecutor(2 * workers + 4, thread_name_prefix="lockstep-serve")
        self.rows_pool = ThreadPoolExecutor(workers + 1, thread_name_prefix="lockstep-rows")
        self.connections: dict[int, Connection] = {}  # in: started and authenticated
        self.starting: dict[int, Connection] = {}  # still in startup, oldest first
        self._keys = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._stopped = asyncio.Event()
        self._workers: QueryWorkers | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # each connection's, until it ends

    @property
    def workers(self) -> QueryWorkers:
        assert self._workers is not None, "serve() starts the query workers"
        return self._workers

    async def serve(self, ready: Callable[[], None] = lambda: None) -> None:
        """Listen until ``stop``; ``ready`` is called once the port is bound."""
        self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
        self._workers = QueryWorkers(self.settings, self.worker_count)
        ready()
        try:
            await self._stopped.wait()
        finally:
            self._server.close()
            for connection in [*self.starting.values(), *self.connections.values()]:
                connection.writer.close()
            if self._tasks:  # each connection ends (its session closed, its lease released) before the pools go
                await asyncio.wait(self._tasks, timeout=10)
            self._workers.close()
            await self._server.wait_closed()
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.rows_pool.shutdown(wait=True, cancel_futures=True)

    def stop(self) -> None:
        self._stopped.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # a vanished client's lease goes too
        key = next(self._keys)
        connection = Connection(self, reader, writer, key)
        if len(self.starting) >= self.max_connections:  # the oldest still starting gives way: silent
            oldest = next(iter(self.starting.values()))  # sockets never lock a client out
            oldest.writer.close()
            self.starting.pop(oldest.key, None)
        self.starting[key] = connection
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await connection.serve()
        finally:
            self._tasks.discard(task)
            self.starting.pop(key, None)
            if connection.admitted:
                self.connections.pop(key, None)

    def admit(self, connection: Connection) -> bool:
        """Move a started connection in, unless ``max_connections`` clients are in already."""
        if len(self.connections) >= self.max_connections:
            connection.send(m.error_response("53300", f"sorry, too many clients already ({self.max_connections})",
                                             "FATAL"))
            return False
        self.starting.pop(connection.key, None)
        connection.admitted = True
        self.connections[connection.key] = connection
        return True

    def cancel(self, key: int, secret: int) -> None:
        """A CancelRequest: the statement that connection runs ends at once with 57014 (a
        running query's worker process is killed)."""
        target = self.connections.get(key)
        if target is not None and target.secret == secret and target.running:
            target.cancelled = True
