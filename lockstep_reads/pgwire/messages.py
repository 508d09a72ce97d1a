"""The PostgreSQL wire protocol (version 3.0) as bytes: the messages a server reads and the ones
it sends. Only what psql, psycopg and the PostgreSQL JDBC driver use is here; the rest of the
protocol (COPY, replication, notifications) is refused by the session, not parsed.

Example::

    >>> ready_for_query("I")
    b'Z\\x00\\x00\\x00\\x05I'
    >>> parse_startup(b"\\x00\\x03\\x00\\x00user\\x00lockstep\\x00\\x00")
    (196608, {'user': 'lockstep'})
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

PROTOCOL_3 = 196608
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102


class ProtocolError(Exception):
    """The client sent bytes that are not the protocol (the connection is closed)."""


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def cstring(text: str) -> bytes:
    return text.encode() + b"\x00"


def parse_startup(body: bytes) -> tuple[int, dict[str, str]]:
    """A startup packet's body (after its length): the protocol code, and its parameters."""
    if len(body) < 4:
        raise ProtocolError("startup packet too short")
    (code,) = struct.unpack("!I", body[:4])
    if code != PROTOCOL_3:
        return code, {}
    fields = body[4:].split(b"\x00")
    pairs = [f.decode(errors="replace") for f in fields]
    return code, {pairs[i]: pairs[i + 1] for i in range(0, len(pairs) - 1, 2) if pairs[i]}


class Reader:
    """Reads the fields of one message body in order."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.at = 0

    def int16(self) -> int:
        (value,) = struct.unpack_from("!h", self.body, self.at)
        self.at += 2
        return int(value)

    def int32(self) -> int:
        (value,) = struct.unpack_from("!i", self.body, self.at)
        self.at += 4
        return int(value)

    def cstring(self) -> str:
        end = self.body.index(b"\x00", self.at)
        text = self.body[self.at:end].decode()
        self.at = end + 1
        return text

    def take(self, n: int) -> bytes:
        chunk = self.body[self.at:self.at + n]
        if len(chunk) != n:
            raise ProtocolError("message shorter than its fields")
        self.at += n
        return chunk

    def rest(self) -> bytes:
        return self.body[self.at:]


@dataclass(frozen=True)
class Parse:
    statement: str
    query: str
    parameter_types: tuple[int, ...]


@dataclass(frozen=True)
class Bind:
    portal: str
    statement: str
    parameter_formats: tuple[int, ...]
    parameters: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]


def read_parse(body: bytes) -> Parse:
    r = Reader(body)
    name, query = r.cstring(), r.cstring()
    return Parse(name, query, tuple(r.int32() for _ in range(r.int16())))


def read_bind(body: bytes) -> Bind:
    r = Reader(body)
    portal, statement = r.cstring(), r.cstring()
    formats = tuple(r.int16() for _ in range(r.int16()))
    values: list[bytes | None] = []
    for _ in range(r.int16()):
        size = r.int32()
        values.append(None if size < 0 else r.take(size))
    return Bind(portal, statement, formats, tuple(values), tuple(r.int16() for _ in range(r.int16())))


def formats_for(formats: Sequence[int], count: int) -> list[int]:
    """Per-value formats from a Bind's list: none means text for all, one applies to all.

    >>> formats_for([], 2), formats_for([1], 3), formats_for([0, 1], 2)
    ([0, 0], [1, 1, 1], [0, 1])
    """
    if not formats:
        return [0] * count
    if len(formats) == 1:
        return [formats[0]] * count
    if len(formats) != count:
        raise ProtocolError(f"{len(formats)} formats for {count} values")
    return list(formats)


# --- what the server sends ---------------------------------------------------------------------

def authentication(code: int, data: bytes = b"") -> bytes:
    return message(b"R", struct.pack("!I", code) + data)


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstring(name) + cstring(value))


def backend_key_data(pid: int, secret: int) -> bytes:
    return message(b"K", struct.pack("!II", pid, secret))


def ready_for_query(status: str) -> bytes:
    return message(b"Z", status.encode())


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    type_size: int
    type_modifier: int = -1


def row_description(columns: Sequence[Column], formats: Sequence[int]) -> bytes:
    parts = [struct.pack("!h", len(columns))]
    for column, fmt in zip(columns, formats_for(formats, len(columns)), strict=True):
        parts.append(cstring(column.name) + struct.pack("!IhIhih", 0, 0, column.type_oid, column.type_size,
                                                         column.type_modifier, fmt))
    return message(b"T", b"".join(parts))


def command_complete(tag: str) -> bytes:
    return message(b"C", cstring(tag))


def parameter_description(oids: Sequence[int]) -> bytes:
    return message(b"t", struct.pack("!h", len(oids)) + b"".join(struct.pack("!I", o) for o in oids))


NO_DATA = message(b"n")
PARSE_COMPLETE = message(b"1")
BIND_COMPLETE = message(b"2")
CLOSE_COMPLETE = message(b"3")
EMPTY_QUERY = message(b"I")
PORTAL_SUSPENDED = message(b"s")


def error_response(sqlstate: str, text: str, severity: str = "ERROR", hint: str = "") -> bytes:
    """An ErrorResponse (or, with severity NOTICE, a NoticeResponse)."""
    fields = [b"S" + cstring(severity), b"V" + cstring(severity), b"C" + cstring(sqlstate), b"M" + cstring(text)]
    if hint:
        fields.append(b"H" + cstring(hint))
    return message(b"N" if severity == "NOTICE" else b"E", b"".join(fields) + b"\x00")
