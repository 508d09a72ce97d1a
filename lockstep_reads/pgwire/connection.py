"""One client's connection to ``lockstep serve``: the protocol's startup, authentication
(``auth.py``), simple query and extended query (Parse, Bind, Describe, Execute, Sync, Close)
flows around a ``Session`` (``session.py``), with the limits (``limits.py``) held from the first
byte. A read's rows come from a query worker (``workers.py``) a batch at a time, each sent once
the client took the last.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import pyarrow as pa

from coordinator.settings import Settings
from lockstep_reads.pgwire import messages as m
from lockstep_reads.pgwire import types
from lockstep_reads.pgwire.auth import MECHANISM, AuthFailed, ScramExchange, ScramSecret, trusted
from lockstep_reads.pgwire.limits import Limits
from lockstep_reads.pgwire.parameters import parameter_count, substitute
from lockstep_reads.pgwire.portals import Batches, Portal, Prepared, TableBatches
from lockstep_reads.pgwire.session import REPORTED, Outcome, Session, SqlError, sql_error
from lockstep_reads.pgwire.workers import QueryWorkers, Rows, Stopped
from lockstep_reads.statements import Kind, Statement, classify, split

log = logging.getLogger(__name__)
DATABASE = USER = "lockstep"
STOPPED = {"timeout": "canceling statement due to statement timeout",
           "cancel": "canceling statement due to user request"}


class Server(Protocol):
    """What a connection needs of its server (``server.WireServer``)."""

    settings: Settings
    trust: str
    secret: ScramSecret | None
    limits: Limits
    pool: ThreadPoolExecutor
    rows_pool: ThreadPoolExecutor

    @property
    def workers(self) -> QueryWorkers: ...

    def admit(self, connection: Connection) -> bool: ...

    def cancel(self, key: int, secret: int) -> None: ...


class ClientStalled(ConnectionError):
    """The client took no rows for the rest of its statement's time: its connection ends."""


def result_columns(schema: pa.Schema) -> list[m.Column]:
    return [m.Column(f.name, (kind := types.pg_type(f.type)).oid, kind.size) for f in schema]


class Connection:
    """One client's connection: the protocol's flows around a ``Session``."""

    def __init__(self, server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: int) -> None:
        self.server, self.reader, self.writer = server, reader, writer
        self.limits = server.limits
        self.key, self.secret = key, secrets.randbits(31)
        self.session: Session | None = None
        self.prepared: dict[str, Prepared] = {}
        self.portals: dict[str, Portal] = {}
        self.skipping = False  # after an error in an extended-query batch: until Sync
        self.running = False
        self.cancelled = False
        self.admitted = False  # counted among the server's connections (started and authenticated)
        self.deadline = math.inf  # the running statement's, from its statement_timeout
        self.result_bytes = 0  # what the running statement has sent (max_result_size)

    # -- bytes in and out ------------------------------------------------------------------------

    async def read_message(self) -> tuple[bytes, bytes | None]:
        """The next message's kind and body; None for a body past the size cap (read and
        dropped without being held: the caller answers 54000). Before authentication a large
        message ends the connection."""
        head = await self.reader.readexactly(5)
        (size,) = struct.unpack("!I", head[1:])
        if size < 4:
            raise m.ProtocolError(f"a message of {size} bytes")
        if self.session is None and size > self.limits.preauth_bytes:
            raise m.ProtocolError(f"a message of {size} bytes before authentication")
        if size - 4 > self.limits.statement_bytes + 64 * 1024:
            left = size - 4
            while left:
                left -= len(await self.reader.readexactly(min(left, 1 << 16)))
            return head[:1], None
        return head[:1], await self.reader.readexactly(size - 4)

    def too_long(self) -> SqlError:
        return SqlError("54000", f"statement is too long: at most {self.limits.statement_bytes} bytes",
                        "split it, or pass large values as parameters of a prepared statement")

    def send(self, *chunks: bytes) -> None:
        self.writer.write(b"".join(chunks))

    async def drain(self) -> None:
        """Wait until the client has taken what was sent, for the rest of the statement's time
        at most (``ClientStalled`` then: a client that reads nothing holds nothing for long)."""
        left = self.deadline - time.monotonic()
        try:
            await asyncio.wait_for(self.writer.drain(), None if math.isinf(left) else max(left, 0.001))
        except TimeoutError:
            raise ClientStalled("the client took no rows until its statement's timeout") from None

    async def fatal(self, sqlstate: str, text: str) -> None:
        self.send(m.error_response(sqlstate, text, "FATAL"))
        await self.writer.drain()

    async def in_pool(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work`` on the server's threads: parsing, a session's decisions, waiting for a worker."""
        return await asyncio.get_running_loop().run_in_executor(self.server.pool, work, *args)

    async def next_batch(self, batches: Batches) -> pa.RecordBatch | None:
        """The next batch: at once when it is here, else waited for on threads of their own (one
        per query worker, never taken by the statements still waiting for a worker)."""
        if batches.ready():
            return batches.next()
        return await asyncio.get_running_loop().run_in_executor(self.server.rows_pool, batches.next)

    # -- startup ---------------------------------------------------------------------------------

    async def startup(self) -> dict[str, str] | None:
        """Startup and authentication: the client's parameters, or None if the connection ends
        here (declined, cancelled, refused)."""
        while True:
            (size,) = struct.unpack("!I", await self.reader.readexactly(4))
            if not 8 <= size <= self.limits.preauth_bytes:
                raise m.ProtocolError(f"a startup packet of {size} bytes")
            body = await self.reader.readexactly(size - 4)
            code, parameters = m.parse_startup(body)
            if code in (m.SSL_REQUEST, m.GSSENC_REQUEST):
                self.send(b"N")  # no TLS or GSS here: the client goes on in plain text or gives up
                await self.writer.drain()
                continue
            if code == m.CANCEL_REQUEST and len(body) == 12:
                self.server.cancel(*struct.unpack("!II", body[4:]))
                return None
            if code != m.PROTOCOL_3:
                await self.fatal("0A000", f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: use 3.0")
                return None
            break
        user, database = parameters.get("user", ""), parameters.get("database") or parameters.get("user", "")
        if user != USER:
            await self.fatal("28000", f'role "{user}" does not exist: connect as user {USER} (-U {USER})')
            return None
        if database != DATABASE:
            await self.fatal("3D000", f'database "{database}" does not exist: connect to database {DATABASE} (-d {DATABASE})')
            return None
        peer = self.writer.get_extra_info("peername") or ("", 0)
        if not trusted(str(peer[0]), self.server.trust):
            if not await self.authenticate():
                return None
        return {"application_name": parameters.get("application_name", "")}

    def welcome(self, parameters: dict[str, str]) -> None:
        self.session = Session(self.server.settings, parameters, self.limits)
        self.send(m.authentication(0), *(m.parameter_status(k, v) for k, v in self.session.parameters.items()
                                          if k in REPORTED), m.backend_key_data(self.key, self.secret),
                  m.ready_for_query("I"))

    async def authenticate(self) -> bool:
        """SCRAM-SHA-256 against ``LOCKSTEP_SERVE_PASSWORD``; False (after a FATAL) if it fails,
        answered only after ``auth_failure_delay_s`` so passwords cannot be guessed quickly."""
        if self.server.secret is None:
            await self.fatal("28000", "this client is not on loopback and no password is set: set "
                                      "LOCKSTEP_SERVE_PASSWORD for lockstep serve (docs/reads.md)")
            return False
        exchange = ScramExchange(self.server.secret)
        self.send(m.authentication(10, m.cstring(MECHANISM) + b"\x00"))
        await self.writer.drain()
        try:
            kind, body = await self.read_message()
            r = m.Reader(body or b"")
            if kind != b"p" or r.cstring() != MECHANISM:
                raise AuthFailed(f"use {MECHANISM}")
            first = r.take(r.int32()).decode()
            self.send(m.authentication(11, exchange.first(first).encode()))
            await self.writer.drain()
            kind, body = await self.read_message()
            if kind != b"p":
                raise AuthFailed("expected the client's SCRAM proof")
            self.send(m.authentication(12, exchange.final((body or b"").decode()).encode()))
            return True
        except (asyncio.IncompleteReadError, ConnectionError):
            raise
        except Exception as exc:  # noqa: BLE001 - a wrong proof, a malformed or oversized SASL body: refused, no traceback
            reason = str(exc) if isinstance(exc, AuthFailed) else "malformed SASL message"
            await asyncio.sleep(self.limits.auth_failure_delay_s)
            await self.fatal("28P01", f'password authentication failed for user "{USER}" ({reason})')
            return False

    # -- running statements ----------------------------------------------------------------------

    def stopped(self) -> str | None:
        return "cancel" if self.cancelled else None

    @contextlib.asynccontextmanager
    async def statement(self) -> Any:
        """One statement's time: its deadline (statement_timeout) starts, a cancel reaches it."""
        assert self.session is not None
        timeout_ms = self.session.limit("statement_timeout")
        self.deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms else math.inf
        self.running, self.cancelled, self.result_bytes = True, False, 0
        try:
            yield
        finally:
            self.running, self.deadline = False, math.inf

    async def run(self, statement: Statement) -> Outcome:
        assert self.session is not None
        outcome: Outcome = await self.in_pool(self.session.execute, statement)
        if self.cancelled:
            raise SqlError("57014", STOPPED["cancel"])
        return outcome

    async def start(self, portal: Portal) -> Outcome:
        """Run the portal's statement (once): a read's rows are then ready to be taken."""
        if portal.outcome is None:
            portal.outcome = outcome = await self.run(portal.statement)
            self.send_outcome_head(outcome)
            if outcome.job is not None:
                workers, job, deadline = self.server.workers, outcome.job, self.deadline

                def begin() -> Rows:  # one hop: a worker (waiting for one), the job sent, its first rows
                    rows = portal.done.enter_context(workers.running(workers.take(deadline, self.stopped), job,
                                                                     deadline, self.stopped))
                    rows.start()
                    return rows

                portal.batches = await self.in_pool(begin)
            elif outcome.table is not None:
                portal.batches = TableBatches(outcome.table)
        return portal.outcome

    async def send_rows(self, portal: Portal, formats: list[int], max_rows: int = 0) -> bool:
        """Send the portal's rows, at most ``max_rows`` (0: all), each batch once the client
        took the last; True if rows are left (the portal is suspended)."""
        assert portal.batches is not None and self.session is not None
        limit, sent = self.session.limit("max_result_size"), 0
        while max_rows <= 0 or sent < max_rows:
            batch = portal.pending if portal.pending is not None else await self.next_batch(portal.batches)
            portal.pending = None
            if batch is None:
                return False
            if max_rows > 0 and batch.num_rows > max_rows - sent:
                batch, portal.pending = batch.slice(0, max_rows - sent), batch.slice(max_rows - sent)
            data = types.data_rows(pa.Table.from_batches([batch]), formats)
            self.result_bytes += len(data)
            if limit and self.result_bytes > limit:
                raise SqlError("53200", f"result exceeds max size of {limit} bytes",
                               "SET max_result_size to allow more, or read less (LIMIT, fewer columns)")
            self.send(data)
            await self.drain()
            sent += batch.num_rows
            portal.sent += batch.num_rows
        portal.pending = portal.pending if portal.pending is not None else await self.next_batch(portal.batches)
        return portal.pending is not None

    def send_error(self, exc: Exception) -> None:
        if isinstance(exc, Stopped):
            exc = SqlError("57014", STOPPED[exc.why])
        error = sql_error(exc)
        self.send(m.error_response(error.sqlstate, str(error), hint=error.hint))
        if self.session is not None and self.session.in_block:
            self.session.failed = True

    def send_outcome_head(self, outcome: Outcome) -> None:
        if outcome.notice:
            self.send(m.error_response("01000" if "no transaction" not in outcome.notice else "25P01",
                                       outcome.notice, "WARNING"))
        for name, value in outcome.reported.items():
            self.send(m.parameter_status(name, value))

    async def simple_query(self, text: str | None) -> None:
        try:
            if text is None:
                raise self.too_long()
            for statement in await self.in_pool(split, text):
                if statement.kind == Kind.EMPTY:
                    self.send(m.EMPTY_QUERY)
                    continue
                portal = Portal(statement, ())
                try:
                    async with self.statement():
                        outcome = await self.start(portal)
                        if portal.batches is not None:
                            formats = [0] * len(portal.batches.schema)
                            self.send(m.row_description(result_columns(portal.batches.schema), formats))
                            await self.send_rows(portal, formats)
                finally:
                    portal.close()
                self.send(m.command_complete(f"SELECT {portal.sent}" if outcome.job is not None else outcome.tag))
        except ConnectionError:
            raise
        except Exception as exc:  # noqa: BLE001 - every error goes to the client; the connection lives on
            self.send_error(exc)
        assert self.session is not None
        self.send(m.ready_for_query(self.session.status))
        await self.writer.drain()

    async def bind(self, bind: m.Bind) -> None:
        prepared = self.prepared.get(bind.statement)
        if prepared is None:
            raise SqlError("26000", f'prepared statement "{bind.statement}" does not exist')
        if bind.portal and bind.portal not in self.portals and len(self.portals) >= self.limits.prepared:
            raise SqlError("54000", f"too many portals ({self.limits.prepared}): close some")
        formats = m.formats_for(bind.parameter_formats, len(bind.parameters))
        oids = prepared.parameter_types + [0] * (len(bind.parameters) - len(prepared.parameter_types))
        try:
            literals = [types.literal(v, oid, f) for v, oid, f in zip(bind.parameters, oids, formats, strict=True)]
        except types.ParameterError as exc:
            raise SqlError("22P02", str(exc)) from exc
        text = substitute(prepared.statement.text, literals) if literals else prepared.statement.text
        statement = await self.in_pool(classify, text) if literals else prepared.statement
        self.close_portal(bind.portal)
        self.portals[bind.portal] = Portal(statement, bind.result_formats)

    def close_portal(self, name: str) -> None:
        portal = self.portals.pop(name, None)
        if portal is not None:
            portal.close()

    async def describe(self, what: str, name: str) -> None:
        if what == "S":
            prepared = self.prepared.get(name)
            if prepared is None:
                raise SqlError("26000", f'prepared statement "{name}" does not exist')
            count = max(len(prepared.parameter_types), parameter_count(prepared.statement.text))
            oids = [o or types.TEXT.oid for o in prepared.parameter_types] + [types.TEXT.oid] * (
                count - len(prepared.parameter_types))
            self.send(m.parameter_description(oids))
            schema = await self.shape(prepared.statement, count)
            self.send(m.row_description(result_columns(schema), []) if schema is not None else m.NO_DATA)
            return
        portal = self.portals.get(name)
        if portal is None:
            raise SqlError("34000", f'portal "{name}" does not exist')
        async with self.statement():
            await self.start(portal)
        self.send(m.row_description(result_columns(portal.batches.schema), portal.result_formats)
                  if portal.batches is not None else m.NO_DATA)

    async def shape(self, statement: Statement, parameters: int) -> pa.Schema | None:
        """The columns a statement's rows will have, before its parameters are bound."""
        if statement.kind == Kind.SHOW:
            probe = Portal(statement, ())
        elif statement.kind == Kind.QUERY:
            text = substitute(statement.text, ["NULL"] * parameters).rstrip().rstrip(";")
            probe = Portal(await self.in_pool(classify, f"SELECT * FROM ({text}) AS __shape LIMIT 0"), ())
        else:
            return None
        try:
            async with self.statement():
                await self.start(probe)
            return probe.batches.schema if probe.batches is not None else None
        finally:
            probe.close()

    async def execute(self, name: str, max_rows: int) -> None:
        portal = self.portals.get(name)
        if portal is None:
            raise SqlError("34000", f'portal "{name}" does not exist')
        if portal.statement.kind == Kind.EMPTY:
            self.send(m.EMPTY_QUERY)
            return
        if portal.expired:
            raise SqlError("57014", STOPPED["timeout"], "a suspended portal keeps its query for the statement's time")
        portal.wake()
        async with self.statement():
            outcome = await self.start(portal)
            if portal.batches is not None:
                formats = m.formats_for(portal.result_formats, len(portal.batches.schema))
                if await self.send_rows(portal, formats, max_rows):
                    self.send(m.PORTAL_SUSPENDED)
                    if isinstance(portal.batches, Rows) and not math.isinf(portal.batches.deadline):
                        # an idle suspended portal frees its query worker when its statement's time is up
                        portal.timer = asyncio.get_running_loop().call_later(
                            max(portal.batches.deadline - time.monotonic(), 0), portal.expire)
                    return
        portal.close()
        self.send(m.command_complete(f"SELECT {portal.sent}" if outcome.job is not None else outcome.tag))

    async def extended(self, kind: bytes, body: bytes | None) -> None:
        if kind == b"S":  # Sync: the batch ends, and outside a transaction block its portals with it
            self.skipping = False
            assert self.session is not None
            for name in [""] if self.session.in_block else list(self.portals):
                self.close_portal(name)
            self.send(m.ready_for_query(self.session.status))
            await self.writer.drain()
            return
        if kind == b"H":
            await self.writer.drain()
            return
        if self.skipping:
            return
        try:
            if body is None:
                raise self.too_long()
            if kind == b"P":
                parse = m.read_parse(body)
                statements = await self.in_pool(split, parse.query)
                if len(statements) > 1:
                    raise SqlError("42601", "cannot insert multiple commands into a prepared statement")
                if parse.statement and parse.statement not in self.prepared and len(self.prepared) >= self.limits.prepared:
                    raise SqlError("54000", f"too many prepared statements ({self.limits.prepared}): close some "
                                   "(Close, DEALLOCATE, or a smaller statement cache in the driver)")
                self.prepared[parse.statement] = Prepared(statements[0], list(parse.parameter_types))
                self.send(m.PARSE_COMPLETE)
            elif kind == b"B":
                await self.bind(m.read_bind(body))
                self.send(m.BIND_COMPLETE)
            elif kind == b"D":
                r = m.Reader(body)
                await self.describe(r.take(1).decode(), r.cstring())
            elif kind == b"E":
                r = m.Reader(body)
                await self.execute(r.cstring(), r.int32())
            elif kind == b"C":
                r = m.Reader(body)
                what, name = r.take(1), r.cstring()
                if what == b"S":
                    self.prepared.pop(name, None)
                else:
                    self.close_portal(name)
                self.send(m.CLOSE_COMPLETE)
            else:
                raise SqlError("0A000", f"protocol message {kind.decode(errors='replace')!r} is not supported here "
                                        "(COPY and function calls are not: Lockstep's tables are read with SELECT)")
        except ConnectionError:
            raise
        except Exception as exc:  # noqa: BLE001 - the client hears of every error; the batch is skipped to Sync
            self.send_error(exc)
            self.skipping = True

    async def next_message(self) -> tuple[bytes, bytes | None]:
        """The next message; inside a transaction block, waited for at most the session's
        idle_in_transaction_session_timeout (then the session ends: 25P03)."""
        assert self.session is not None
        idle_ms = self.session.limit("idle_in_transaction_session_timeout") if self.session.in_block else 0
        if not idle_ms:
            return await self.read_message()
        try:
            return await asyncio.wait_for(self.read_message(), idle_ms / 1000)
        except TimeoutError:
            await self.fatal("25P03", "terminating connection due to idle-in-transaction timeout")
            raise ClientStalled("idle in a transaction past its timeout") from None

    async def serve(self) -> None:
        try:
            try:
                parameters = await asyncio.wait_for(self.startup(), self.limits.startup_s)
            except TimeoutError:
                log.debug("connection %d did not start within %.0f s", self.key, self.limits.startup_s)
                return
            if parameters is None or not self.server.admit(self):
                await self.writer.drain()
                return
            self.welcome(parameters)
            await self.writer.drain()
            while True:
                kind, body = await self.next_message()
                if kind == b"X":
                    return
                if kind == b"Q":
                    await self.simple_query(None if body is None else m.Reader(body).cstring())
                else:
                    await self.extended(kind, body)
        except (asyncio.IncompleteReadError, ConnectionError, m.ProtocolError) as exc:
            log.debug("connection %d ended: %s", self.key, exc)
        finally:
            for name in list(self.portals):
                self.close_portal(name)
            if self.session is not None:
                await self.in_pool(self.session.close)
            self.writer.close()


