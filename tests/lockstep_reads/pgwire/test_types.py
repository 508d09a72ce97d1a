"""Values on the wire as PostgreSQL writes them, and parameters as safe SQL literals."""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal

import pyarrow as pa
import pytest

from lockstep_reads.pgwire.types import (
    BOOL,
    FLOAT8,
    INT4,
    INT8,
    JSON,
    NUMERIC,
    TEXT,
    TIMESTAMPTZ,
    ParameterError,
    binary_value,
    data_rows,
    literal,
    pg_type,
)


@pytest.mark.parametrize(("arrow", "expected"), [
    (pa.int32(), INT4), (pa.int64(), INT8), (pa.float64(), FLOAT8), (pa.string(), TEXT), (pa.bool_(), BOOL),
    (pa.decimal128(10, 2), NUMERIC), (pa.timestamp("us", "UTC"), TIMESTAMPTZ), (pa.list_(pa.int32()), JSON),
])
def test_arrow_types_map_to_postgres_types(arrow: pa.DataType, expected: object) -> None:
    assert pg_type(arrow) is expected


def rows_of(messages: bytes) -> list[list[bytes | None]]:
    """DataRow messages read back: each row's values (None for NULL)."""
    rows, at = [], 0
    while at < len(messages):
        assert messages[at:at + 1] == b"D"
        (size,) = struct.unpack_from("!I", messages, at + 1)
        end, (count,), at = at + 1 + size, struct.unpack_from("!h", messages, at + 5), at + 7
        values: list[bytes | None] = []
        for _ in range(count):
            (length,) = struct.unpack_from("!i", messages, at)
            values.append(None if length < 0 else messages[at + 4:at + 4 + length])
            at += 4 + max(length, 0)
        assert at == end, "a row's length is the sum of its values'"
        rows.append(values)
    return rows


def test_rows_in_text_format_read_as_postgres_prints_them() -> None:
    table = pa.table({"b": [True, None], "f": [250.0, float("nan")], "d": [Decimal("1.50"), Decimal("-0.01")],
                      "t": pa.array([dt.datetime(2026, 1, 2, 3, 4, 5, 6), None], pa.timestamp("us", "UTC")),
                      "x": [b"\x00\xff", b""], "l": [[1, None], []], "s": ["é", None]})
    assert rows_of(data_rows(table, [0] * 7)) == [
        [b"t", b"250", b"1.50", b"2026-01-02 03:04:05.000006+00", b"\\x00ff", b"[1, null]", "é".encode()],
        [None, b"NaN", b"-0.01", None, b"\\x", b"[]", None],
    ]


def test_rows_in_binary_format_and_a_mix_of_formats() -> None:
    table = pa.table({"n": pa.array([7, None], pa.int64()), "f": [0.5, -1.0], "b": [False, True], "s": ["x", "y"]})
    assert rows_of(data_rows(table, [1, 1, 1, 0])) == [
        [struct.pack("!q", 7), struct.pack("!d", 0.5), b"\x00", b"x"],
        [None, struct.pack("!d", -1.0), b"\x01", b"y"],
    ]
    assert data_rows(table.slice(0, 0), [0] * 4) == b""


@pytest.mark.parametrize(("value", "expected"), [
    # ndigits, weight, sign, dscale, base-10000 digits (PostgreSQL's numeric_send)
    (Decimal("0"), (0, 0, 0, 0)),
    (Decimal("1.50"), (2, 0, 0, 2, 1, 5000)),
    (Decimal("-12345.678"), (3, 1, 0x4000, 3, 1, 2345, 6780)),
    (Decimal("0.0001"), (1, -1, 0, 4, 1)),
    (Decimal("10000"), (1, 1, 0, 0, 1)),
])
def test_numeric_binary_is_postgres_base_10000(value: Decimal, expected: tuple[int, ...]) -> None:
    raw = binary_value(value, pa.decimal128(20, 4))
    assert struct.unpack(f"!hhHh{(len(raw) - 8) // 2}H", raw) == expected


def test_timestamps_in_binary_count_microseconds_from_2000() -> None:
    at = dt.datetime(2000, 1, 1, 0, 0, 1, tzinfo=dt.UTC)
    assert struct.unpack("!q", binary_value(at, pa.timestamp("us", "UTC"))) == (1_000_000,)


@pytest.mark.parametrize(("raw", "oid", "fmt", "expected"), [
    (b"42", 23, 0, "42"), (struct.pack("!q", -7), 20, 1, "-7"), (b"it's; DROP TABLE x", 0, 0, "'it''s; DROP TABLE x'"),
    (b"t", 16, 0, "TRUE"), (b"1.5", 1700, 0, "1.5"), (struct.pack("!d", 0.25), 701, 1, "CAST(0.25 AS DOUBLE)"),
    (None, 23, 0, "NULL"), (b"\\x00ff", 17, 0, "X'00ff'"), (b"2026-01-02", 1082, 0, "DATE '2026-01-02'"),
])
def test_parameters_become_literals_that_cannot_escape(raw: bytes | None, oid: int, fmt: int, expected: str) -> None:
    assert literal(raw, oid, fmt) == expected


@pytest.mark.parametrize(("raw", "oid"), [(b"1; DROP TABLE x", 23), (b"nan-ish", 701), (b"maybe", 16)])
def test_a_parameter_that_does_not_fit_its_type_is_refused(raw: bytes, oid: int) -> None:
    with pytest.raises(ParameterError):
        literal(raw, oid, 0)
