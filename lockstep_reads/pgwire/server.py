"""``lockstep serve``: Lockstep's tables to any PostgreSQL client (psql, psycopg, JDBC, BI tools).

An asyncio server speaks the protocol's startup, authentication (``auth.py``), simple query and
extended query (Parse, Bind, Describe, Execute, Sync, Close) flows; each connection's statements
run one at a time in a small thread pool (``session.py`` decides what they do), so one slow read
never stops the others' connections. TLS is not spoken (an SSLRequest is declined, as a server
without certificates does): reach it over loopback, an SSH tunnel or a TLS proxy.

Example::

    server = WireServer(settings, port=5433)
    asyncio.run(server.serve(ready=lambda: print("up")))     # until server.stop()
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import socket
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
from sqlglot.tokens import Tokenizer, TokenType

from coordinator.settings import Settings
from lockstep_reads.pgwire import messages as m
from lockstep_reads.pgwire import types
from lockstep_reads.pgwire.auth import MECHANISM, AuthFailed, ScramExchange, ScramSecret, trusted
from lockstep_reads.pgwire.session import REPORTED, Outcome, Session, SqlError
from lockstep_reads.statements import DIALECT, Kind, Statement, StatementError, classify, split

log = logging.getLogger(__name__)
DATABASE = USER = "lockstep"
STARTUP_TIMEOUT_S = 30.0


@dataclass
class Prepared:
    statement: Statement
    parameter_types: list[int]


@dataclass
class Portal:
    statement: Statement
    result_formats: tuple[int, ...]
    outcome: Outcome | None = None
    rows: pa.Table | None = None  # the rows still to send (Execute may ask for some at a time)


def parameter_count(text: str) -> int:
    """How many ``$n`` placeholders a statement uses (the highest n)."""
    numbers = [int(tok.text[1:]) for tok in _tokens(text) if tok.text[:1] == "$" and tok.text[1:].isdigit()]
    return max(numbers, default=0)


def _tokens(text: str) -> list:  # type: ignore[type-arg]
    try:
        return Tokenizer(dialect=DIALECT).tokenize(text)
    except Exception:  # noqa: BLE001 - an untokenizable text has no parameters; the parser says what is wrong
        return []


def substitute(text: str, literals: list[str]) -> str:
    """``text`` with each ``$n`` replaced by its literal (not inside strings or comments).

    >>> substitute("SELECT * FROM t WHERE a = $1 AND b = '$2' AND c = $2", ["1", "'x'"])
    "SELECT * FROM t WHERE a = 1 AND b = '$2' AND c = 'x'"
    """
    out, at = [], 0
    for tok in _tokens(text):
        if tok.token_type != TokenType.STRING and tok.text[:1] == "$" and tok.text[1:].isdigit():
            n = int(tok.text[1:])
            if not 1 <= n <= len(literals):
                raise SqlError("08P01", f"there is no parameter ${n}")
            out += [text[at:tok.start], literals[n - 1]]
            at = tok.end + 1
    return "".join(out) + text[at:]


def result_columns(table: pa.Table) -> list[m.Column]:
    return [m.Column(f.name, (kind := types.pg_type(f.type)).oid, kind.size) for f in table.schema]


class Connection:
    """One client's connection: the protocol's flows around a ``Session``."""

    def __init__(self, server: WireServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: int) -> None:
        self.server, self.reader, self.writer = server, reader, writer
        self.key, self.secret = key, secrets.randbits(31)
        self.session: Session | None = None
        self.prepared: dict[str, Prepared] = {}
        self.portals: dict[str, Portal] = {}
        self.skipping = False  # after an error in an extended-query batch: until Sync
        self.running = False
        self.cancelled = False

    async def read_message(self) -> tuple[bytes, bytes]:
        head = await self.reader.readexactly(5)
        (size,) = struct.unpack("!I", head[1:])
        if size < 4 or size > 256 * 1024 * 1024:
            raise m.ProtocolError(f"a message of {size} bytes")
        return head[:1], await self.reader.readexactly(size - 4)

    def send(self, *chunks: bytes) -> None:
        self.writer.write(b"".join(chunks))

    async def fatal(self, sqlstate: str, text: str) -> None:
        self.send(m.error_response(sqlstate, text, "FATAL"))
        await self.writer.drain()

    async def startup(self) -> bool:
        """Startup and authentication; False if the connection ends here (declined, cancelled, refused)."""
        while True:
            (size,) = struct.unpack("!I", await self.reader.readexactly(4))
            if not 8 <= size <= 10_000:
                raise m.ProtocolError(f"a startup packet of {size} bytes")
            body = await self.reader.readexactly(size - 4)
            code, parameters = m.parse_startup(body)
            if code in (m.SSL_REQUEST, m.GSSENC_REQUEST):
                self.send(b"N")  # no TLS or GSS here: the client goes on in plain text or gives up
                await self.writer.drain()
                continue
            if code == m.CANCEL_REQUEST and len(body) == 12:
                self.server.cancel(*struct.unpack("!II", body[4:]))
                return False
            if code != m.PROTOCOL_3:
                await self.fatal("0A000", f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: use 3.0")
                return False
            break
        user, database = parameters.get("user", ""), parameters.get("database") or parameters.get("user", "")
        if user != USER:
            await self.fatal("28000", f'role "{user}" does not exist: connect as user {USER} (-U {USER})')
            return False
        if database != DATABASE:
            await self.fatal("3D000", f'database "{database}" does not exist: connect to database {DATABASE} (-d {DATABASE})')
            return False
        peer = self.writer.get_extra_info("peername") or ("", 0)
        if not trusted(str(peer[0]), self.server.trust):
            if not await self.authenticate():
                return False
        self.session = Session(self.server.settings, {"application_name": parameters.get("application_name", "")})
        self.send(m.authentication(0), *(m.parameter_status(k, v) for k, v in self.session.parameters.items()
                                          if k in REPORTED), m.backend_key_data(self.key, self.secret),
                  m.ready_for_query("I"))
        await self.writer.drain()
        return True

    async def authenticate(self) -> bool:
        """SCRAM-SHA-256 against ``LOCKSTEP_SERVE_PASSWORD``; False (after a FATAL) if it fails."""
        if self.server.secret is None:
            await self.fatal("28000", "this client is not on loopback and no password is set: set "
                                      "LOCKSTEP_SERVE_PASSWORD for lockstep serve (docs/reads.md)")
            return False
        exchange = ScramExchange(self.server.secret)
        self.send(m.authentication(10, m.cstring(MECHANISM) + b"\x00"))
        await self.writer.drain()
        try:
            kind, body = await self.read_message()
            r = m.Reader(body)
            if kind != b"p" or r.cstring() != MECHANISM:
                raise AuthFailed(f"use {MECHANISM}")
            first = r.take(r.int32()).decode()
            self.send(m.authentication(11, exchange.first(first).encode()))
            await self.writer.drain()
            kind, body = await self.read_message()
            if kind != b"p":
                raise AuthFailed("expected the client's SCRAM proof")
            self.send(m.authentication(12, exchange.final(body.decode()).encode()))
            return True
        except (AuthFailed, UnicodeDecodeError) as exc:
            await self.fatal("28P01", f'password authentication failed for user "{USER}" ({exc})')
            return False

    async def run(self, statement: Statement) -> Outcome:
        self.running, self.cancelled = True, False
        try:
            assert self.session is not None
            outcome = await asyncio.get_running_loop().run_in_executor(self.server.pool, self.session.execute, statement)
        finally:
            self.running = False
        if self.cancelled:
            raise SqlError("57014", "canceling statement due to user request")
        return outcome

    def send_error(self, exc: Exception) -> None:
        error = exc if isinstance(exc, SqlError) else SqlError("42601" if isinstance(exc, StatementError) else "XX000",
                                                               str(exc))
        self.send(m.error_response(error.sqlstate, str(error), hint=error.hint))

    def send_outcome_head(self, outcome: Outcome) -> None:
        if outcome.notice:
            self.send(m.error_response("01000" if "no transaction" not in outcome.notice else "25P01",
                                       outcome.notice, "WARNING"))
        for name, value in outcome.reported.items():
            self.send(m.parameter_status(name, value))

    async def simple_query(self, text: str) -> None:
        try:
            for statement in split(text):
                if statement.kind == Kind.EMPTY:
                    self.send(m.EMPTY_QUERY)
                    continue
                outcome = await self.run(statement)
                self.send_outcome_head(outcome)
                if outcome.table is not None:
                    formats = [0] * outcome.table.num_columns
                    self.send(m.row_description(result_columns(outcome.table), formats),
                              types.data_rows(outcome.table, formats))
                self.send(m.command_complete(outcome.tag))
        except Exception as exc:  # noqa: BLE001 - every error goes to the client; the connection lives on
            self.send_error(exc)
        assert self.session is not None
        self.send(m.ready_for_query(self.session.status))
        await self.writer.drain()

    def bind(self, bind: m.Bind) -> None:
        prepared = self.prepared.get(bind.statement)
        if prepared is None:
            raise SqlError("26000", f'prepared statement "{bind.statement}" does not exist')
        formats = m.formats_for(bind.parameter_formats, len(bind.parameters))
        oids = prepared.parameter_types + [0] * (len(bind.parameters) - len(prepared.parameter_types))
        try:
            literals = [types.literal(v, oid, f) for v, oid, f in zip(bind.parameters, oids, formats, strict=True)]
        except types.ParameterError as exc:
            raise SqlError("22P02", str(exc)) from exc
        text = substitute(prepared.statement.text, literals) if literals else prepared.statement.text
        self.portals[bind.portal] = Portal(classify(text) if literals else prepared.statement, bind.result_formats)

    async def describe(self, what: str, name: str) -> None:
        if what == "S":
            prepared = self.prepared.get(name)
            if prepared is None:
                raise SqlError("26000", f'prepared statement "{name}" does not exist')
            count = max(len(prepared.parameter_types), parameter_count(prepared.statement.text))
            oids = [o or types.TEXT.oid for o in prepared.parameter_types] + [types.TEXT.oid] * (
                count - len(prepared.parameter_types))
            self.send(m.parameter_description(oids))
            table = await self.shape(prepared.statement, count)
            self.send(m.row_description(result_columns(table), []) if table is not None else m.NO_DATA)
            return
        portal = self.portals.get(name)
        if portal is None:
            raise SqlError("34000", f'portal "{name}" does not exist')
        outcome = await self.execute_portal(portal)
        self.send(m.row_description(result_columns(outcome.table), portal.result_formats)
                  if outcome.table is not None else m.NO_DATA)

    async def shape(self, statement: Statement, parameters: int) -> pa.Table | None:
        """The columns a statement's rows will have, before its parameters are bound."""
        if statement.kind == Kind.SHOW:
            return (await self.run(statement)).table
        if statement.kind != Kind.QUERY:
            return None
        text = substitute(statement.text, ["NULL"] * parameters).rstrip().rstrip(";")
        return (await self.run(classify(f"SELECT * FROM ({text}) AS __lockstep_shape LIMIT 0"))).table

    async def execute_portal(self, portal: Portal) -> Outcome:
        if portal.outcome is None:
            portal.outcome = await self.run(portal.statement)
            self.send_outcome_head(portal.outcome)
            portal.rows = portal.outcome.table
        return portal.outcome

    async def execute(self, name: str, max_rows: int) -> None:
        portal = self.portals.get(name)
        if portal is None:
            raise SqlError("34000", f'portal "{name}" does not exist')
        if portal.statement.kind == Kind.EMPTY:
            self.send(m.EMPTY_QUERY)
            return
        outcome = await self.execute_portal(portal)
        rows = portal.rows
        if rows is not None:
            batch = rows if max_rows <= 0 else rows.slice(0, max_rows)
            self.send(types.data_rows(batch, m.formats_for(portal.result_formats, rows.num_columns)))
            portal.rows = rows.slice(batch.num_rows)
            if portal.rows.num_rows:
                self.send(m.PORTAL_SUSPENDED)
                return
        self.send(m.command_complete(outcome.tag))

    async def extended(self, kind: bytes, body: bytes) -> None:
        if kind == b"S":  # Sync: the batch ends
            self.skipping = False
            self.portals.pop("", None)
            assert self.session is not None
            self.send(m.ready_for_query(self.session.status))
            await self.writer.drain()
            return
        if kind == b"H":
            await self.writer.drain()
            return
        if self.skipping:
            return
        try:
            if kind == b"P":
                parse = m.read_parse(body)
                statements = split(parse.query)
                if len(statements) > 1:
                    raise SqlError("42601", "cannot insert multiple commands into a prepared statement")
                self.prepared[parse.statement] = Prepared(statements[0], list(parse.parameter_types))
                self.send(m.PARSE_COMPLETE)
            elif kind == b"B":
                self.bind(m.read_bind(body))
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
                (self.prepared if what == b"S" else self.portals).pop(name, None)  # type: ignore[arg-type]
                self.send(m.CLOSE_COMPLETE)
            else:
                raise SqlError("0A000", f"protocol message {kind.decode(errors='replace')!r} is not supported here "
                                        "(COPY and function calls are not: Lockstep's tables are read with SELECT)")
        except Exception as exc:  # noqa: BLE001 - the client hears of every error; the batch is skipped to Sync
            self.send_error(exc)
            self.skipping = True
            if self.session is not None and self.session.in_block:
                self.session.failed = True

    async def serve(self) -> None:
        try:
            if not await asyncio.wait_for(self.startup(), STARTUP_TIMEOUT_S):
                return
            while True:
                kind, body = await self.read_message()
                if kind == b"X":
                    return
                if kind == b"Q":
                    await self.simple_query(m.Reader(body).cstring())
                else:
                    await self.extended(kind, body)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, m.ProtocolError) as exc:
            log.debug("connection %d ended: %s", self.key, exc)
        finally:
            if self.session is not None:
                await asyncio.get_running_loop().run_in_executor(self.server.pool, self.session.close)
            self.writer.close()


class WireServer:
    """See the module. ``trust``: ``loopback`` lets loopback clients in without a password,
    ``none`` asks every client for ``password``."""

    def __init__(self, settings: Settings, host: str = "127.0.0.1", port: int = 5433, trust: str = "loopback",
                 password: str = "", max_connections: int = 200, workers: int = 4) -> None:
        self.settings, self.host, self.port, self.trust = settings, host, port, trust
        self.secret = ScramSecret.of(password) if password else None
        self.max_connections = max_connections
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="lockstep-serve")
        self.connections: dict[int, Connection] = {}
        self._keys = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._stopped = asyncio.Event()

    async def serve(self, ready: Callable[[], None] = lambda: None) -> None:
        """Listen until ``stop``; ``ready`` is called once the port is bound."""
        self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
        ready()
        try:
            await self._stopped.wait()
        finally:
            self._server.close()
            for connection in list(self.connections.values()):
                connection.writer.close()
            await self._server.wait_closed()
            self.pool.shutdown(wait=True, cancel_futures=True)

    def stop(self) -> None:
        self._stopped.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # a vanished client's lease goes too
        key = next(self._keys)
        connection = Connection(self, reader, writer, key)
        if len(self.connections) >= self.max_connections:
            await connection.fatal("53300", f"sorry, too many clients already ({self.max_connections})")
            writer.close()
            return
        self.connections[key] = connection
        try:
            await connection.serve()
        finally:
            self.connections.pop(key, None)

    def cancel(self, key: int, secret: int) -> None:
        """A CancelRequest: the statement that connection runs ends in an error instead of its rows."""
        target = self.connections.get(key)
        if target is not None and target.secret == secret and target.running:
            target.cancelled = True
