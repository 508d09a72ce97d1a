"""The protocol's messages as bytes (PostgreSQL's frontend/backend protocol 3.0)."""

from __future__ import annotations

import struct

import pytest

from lockstep_reads.pgwire.messages import (
    Column,
    ProtocolError,
    error_response,
    formats_for,
    read_bind,
    read_parse,
    row_description,
)


def test_parse_and_bind_bodies_read_as_a_driver_writes_them() -> None:
    parse = b"s1\x00SELECT $1\x00" + struct.pack("!hI", 1, 23)
    assert read_parse(parse) == type(read_parse(parse))("s1", "SELECT $1", (23,))
    bind = (b"p\x00s1\x00" + struct.pack("!hh", 1, 1) + struct.pack("!h", 2) + struct.pack("!i", 4) + b"\x00\x00\x00\x07"
            + struct.pack("!i", -1) + struct.pack("!hh", 1, 0))
    decoded = read_bind(bind)
    assert (decoded.portal, decoded.statement, decoded.parameters, decoded.result_formats) == ("p", "s1",
                                                                                                (b"\x00\x00\x00\x07", None),
                                                                                                (0,))


def test_a_bind_shorter_than_its_fields_is_a_protocol_error() -> None:
    with pytest.raises((ProtocolError, struct.error)):
        read_bind(b"p\x00s1\x00" + struct.pack("!hh", 0, 1) + struct.pack("!i", 10) + b"abc")
    with pytest.raises(ProtocolError, match="3 formats for 2 values"):
        formats_for([0, 1, 0], 2)


def test_rows_and_errors_are_framed_with_their_lengths() -> None:
    described = row_description([Column("n", 20, 8)], [])
    assert described[:1] == b"T" and struct.unpack("!I", described[1:5])[0] == len(described) - 1
    error = error_response("42P01", "unknown table", hint="list them with \\dt")
    assert error.startswith(b"E") and b"C42P01\x00" in error and b"Hlist them with \\dt\x00" in error
