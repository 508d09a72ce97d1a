"""Values between Arrow and the wire: each Arrow type's PostgreSQL type (OID), its text and
binary encodings for result rows, and parameters from the wire as SQL literals.

Lists, structs and maps go out as ``json``; everything else as the PostgreSQL type a client
expects for it (``bigint``, ``double precision``, ``numeric``, ``timestamptz`` ...).

Example::

    >>> import pyarrow as pa
    >>> pg_type(pa.int64()), text_value(True, pa.bool_()), literal(b"it's", 25, 0)
    (PgType(oid=20, size=8, name='int8'), b't', "'it''s'")
"""

from __future__ import annotations

import datetime as dt
import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

POSTGRES_EPOCH = dt.datetime(2000, 1, 1)
POSTGRES_EPOCH_DATE = POSTGRES_EPOCH.date()


@dataclass(frozen=True)
class PgType:
    oid: int
    size: int  # bytes, -1: variable
    name: str


BOOL, BYTEA, INT8, INT2, INT4, TEXT, OID, JSON = (PgType(16, 1, "bool"), PgType(17, -1, "bytea"), PgType(20, 8, "int8"),
                                                  PgType(21, 2, "int2"), PgType(23, 4, "int4"), PgType(25, -1, "text"),
                                                  PgType(26, 4, "oid"), PgType(114, -1, "json"))
FLOAT4, FLOAT8, VARCHAR, DATE, TIME = (PgType(700, 4, "float4"), PgType(701, 8, "float8"), PgType(1043, -1, "varchar"),
                                       PgType(1082, 4, "date"), PgType(1083, 8, "time"))
TIMESTAMP, TIMESTAMPTZ, NUMERIC = PgType(1114, 8, "timestamp"), PgType(1184, 8, "timestamptz"), PgType(1700, -1, "numeric")
BY_OID = {t.oid: t for t in (BOOL, BYTEA, INT8, INT2, INT4, TEXT, OID, JSON, FLOAT4, FLOAT8, VARCHAR, DATE, TIME,
                             TIMESTAMP, TIMESTAMPTZ, NUMERIC)}


class ParameterError(ValueError):
    """A parameter's bytes do not fit its type; the message says which."""


def pg_type(arrow: pa.DataType) -> PgType:
    """The PostgreSQL type an Arrow column is sent as."""
    if pt.is_boolean(arrow):
        return BOOL
    if pt.is_int8(arrow) or pt.is_int16(arrow) or pt.is_uint8(arrow):
        return INT2
    if pt.is_int32(arrow) or pt.is_uint16(arrow):
        return INT4
    if pt.is_integer(arrow):
        return INT8
    if pt.is_float16(arrow) or pt.is_float32(arrow):
        return FLOAT4
    if pt.is_floating(arrow):
        return FLOAT8
    if pt.is_decimal(arrow):
        return NUMERIC
    if pt.is_string(arrow) or pt.is_large_string(arrow) or pt.is_string_view(arrow) or pt.is_null(arrow):
        return TEXT
    if pt.is_binary(arrow) or pt.is_large_binary(arrow) or pt.is_fixed_size_binary(arrow) or pt.is_binary_view(arrow):
        return BYTEA
    if pt.is_date(arrow):
        return DATE
    if pt.is_timestamp(arrow):
        return TIMESTAMPTZ if arrow.tz is not None else TIMESTAMP
    if pt.is_time(arrow):
        return TIME
    return JSON


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Decimal):
        return str(value)
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _float_text(value: float) -> str:
    """As PostgreSQL prints a double: the shortest exact form, whole numbers without ".0".

    >>> _float_text(250.0), _float_text(0.1), _float_text(float("-inf"))
    ('250', '0.1', '-Infinity')
    """
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def text_value(value: Any, arrow: pa.DataType) -> bytes:
    """One non-null value in PostgreSQL's text format."""
    kind = pg_type(arrow)
    if kind is BOOL:
        return b"t" if value else b"f"
    if kind in (FLOAT4, FLOAT8):
        return _float_text(float(value)).encode()
    if kind is BYTEA:
        return b"\\x" + bytes(value).hex().encode()
    if kind is TIMESTAMPTZ:
        return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f+00").encode()
    if kind is TIMESTAMP:
        return value.strftime("%Y-%m-%d %H:%M:%S.%f").encode()
    if kind is JSON:
        if isinstance(value, list) and value and isinstance(value[0], tuple) and pt.is_map(arrow):
            value = dict(value)
        return json.dumps(value, default=_json_default).encode()
    return str(value).encode()


def _numeric_binary(value: Decimal) -> bytes:
    """PostgreSQL's binary numeric: base-10000 digits, weight, sign, display scale."""
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        return struct.pack("!hhHh", 0, 0, 0xC000, 0)  # NaN
    scale = max(-exponent, 0)
    text = "".join(map(str, digits)) or "0"
    if exponent > 0:
        text += "0" * exponent
    text = text.rjust(scale + 1, "0")
    whole, fraction = (text[:len(text) - scale] or "0"), text[len(text) - scale:] if scale else ""
    whole = whole.lstrip("0")
    whole = "0" * (-len(whole) % 4) + whole
    fraction += "0" * (-len(fraction) % 4)
    groups = [int(whole[i:i + 4]) for i in range(0, len(whole), 4)] + [int(fraction[i:i + 4])
                                                                       for i in range(0, len(fraction), 4)]
    weight = len(whole) // 4 - 1
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    return struct.pack(f"!hhHh{len(groups)}H", len(groups), weight, 0x4000 if sign else 0, scale, *groups)


def binary_value(value: Any, arrow: pa.DataType) -> bytes:
    """One non-null value in PostgreSQL's binary format."""
    kind = pg_type(arrow)
    if kind is BOOL:
        return b"\x01" if value else b"\x00"
    packers: dict[PgType, Callable[[Any], bytes]] = {
        INT2: lambda v: struct.pack("!h", v), INT4: lambda v: struct.pack("!i", v), INT8: lambda v: struct.pack("!q", v),
        FLOAT4: lambda v: struct.pack("!f", v), FLOAT8: lambda v: struct.pack("!d", v), BYTEA: bytes,
        DATE: lambda v: struct.pack("!i", (v - POSTGRES_EPOCH_DATE).days),
        TIME: lambda v: struct.pack("!q", ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond),
        TIMESTAMP: lambda v: struct.pack("!q", (v - POSTGRES_EPOCH) // dt.timedelta(microseconds=1)),
        TIMESTAMPTZ: lambda v: struct.pack("!q", (v.astimezone(dt.UTC).replace(tzinfo=None) - POSTGRES_EPOCH)
                                           // dt.timedelta(microseconds=1)),
        NUMERIC: lambda v: _numeric_binary(Decimal(v)),
    }
    packer = packers.get(kind)
    return packer(value) if packer is not None else text_value(value, arrow)


_BINARY_LAYOUT = {INT2: ">i2", INT4: ">i4", INT8: ">i8", FLOAT4: ">f4", FLOAT8: ">f8"}


def _python_values(column: pa.ChunkedArray, fmt: int) -> pa.Array:
    encode = binary_value if fmt == 1 else text_value
    kind = column.type
    return pa.array([None if v is None else encode(v, kind) for v in column.to_pylist()], pa.binary())


def wire_values(column: pa.ChunkedArray, fmt: int) -> pa.Array:
    """A column's values in a format (0 text, 1 binary) as one binary array, NULL where NULL:
    numbers, strings, booleans and dates by Arrow's compute kernels, the rest value by value."""
    kind = pg_type(column.type)
    array = column.combine_chunks()
    if fmt == 1 and kind in _BINARY_LAYOUT:
        layout = _BINARY_LAYOUT[kind]
        size = int(layout[-1])
        raw = array.fill_null(0).to_numpy(zero_copy_only=False).astype(layout).tobytes()
        cells = pa.FixedSizeBinaryArray.from_buffers(pa.binary(size), len(array), [None, pa.py_buffer(raw)])
        return pc.if_else(array.is_null(), pa.scalar(None, pa.binary()), cells.cast(pa.binary()))
    if fmt == 1 and kind is BOOL:
        return pc.if_else(array, b"\x01", b"\x00").cast(pa.binary())
    if fmt == 0 and kind is BOOL:
        return pc.if_else(array, b"t", b"f").cast(pa.binary())
    if fmt == 0 and kind in (FLOAT4, FLOAT8):
        text = pc.cast(array, pa.string())
        if pc.any(pc.invert(pc.is_finite(array))).as_py():
            for arrow_text, postgres in (("nan", "NaN"), ("inf", "Infinity"), ("-inf", "-Infinity")):
                text = pc.replace_substring_regex(text, f"^{arrow_text}$", postgres)
        return text.cast(pa.binary())
    if fmt == 0 and kind in (TIMESTAMP, TIMESTAMPTZ):
        instants = array.cast(pa.timestamp("us", "UTC" if kind is TIMESTAMPTZ else None))
        text = pc.strftime(instants, format="%Y-%m-%d %H:%M:%S")
        return (pc.binary_join_element_wise(text, "+00", "") if kind is TIMESTAMPTZ else text).cast(pa.binary())
    if fmt == 0 and (kind in (INT2, INT4, INT8, NUMERIC, TEXT, DATE) or pt.is_dictionary(array.type)):
        return pc.cast(array, pa.string()).cast(pa.binary())
    return _python_values(column, fmt)


def data_rows(table: pa.Table, formats: list[int]) -> bytes:
    """Every row of ``table`` as DataRow messages, one bytes object: each column's cells
    (length and value, or -1 for NULL) are built by column, then joined row by row in Arrow."""
    count = table.num_rows
    if count == 0:
        return b""
    cells, sizes = [], np.full(count, 4 + 2, dtype=np.int64)
    for column, fmt in zip(table.columns, formats, strict=True):
        values = wire_values(column, fmt)
        lengths = pc.binary_length(values).to_numpy(zero_copy_only=False)
        lengths = np.where(np.isnan(lengths), -1, lengths).astype(np.int64) if lengths.dtype.kind == "f" else lengths
        prefix = pa.FixedSizeBinaryArray.from_buffers(pa.binary(4), count,
                                                      [None, pa.py_buffer(lengths.astype(">i4").tobytes())])
        cells.append(pc.binary_join_element_wise(prefix.cast(pa.binary()), values.fill_null(b""), b""))
        sizes += 4 + np.maximum(lengths, 0)
    head = np.zeros(count, dtype=[("kind", "S1"), ("size", ">i4"), ("columns", ">i2")])
    head["kind"], head["size"], head["columns"] = b"D", sizes, table.num_columns
    heads = pa.FixedSizeBinaryArray.from_buffers(pa.binary(7), count, [None, pa.py_buffer(head.tobytes())])
    rows = pc.binary_join_element_wise(heads.cast(pa.binary()), *cells, b"")
    offsets = np.frombuffer(rows.buffers()[1], dtype=np.int32, count=count + 1, offset=rows.offset * 4)
    return rows.buffers()[2].to_pybytes()[offsets[0]:offsets[-1]]


# --- parameters ---------------------------------------------------------------------------------

def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def decode_binary(raw: bytes, oid: int) -> str:
    """A binary-format parameter as the text PostgreSQL would print for it."""
    try:
        if oid in (INT2.oid, INT4.oid, INT8.oid, OID.oid):
            return str(int.from_bytes(raw, "big", signed=oid != OID.oid))
        if oid == FLOAT4.oid:
            return _float_text(struct.unpack("!f", raw)[0])
        if oid == FLOAT8.oid:
            return _float_text(struct.unpack("!d", raw)[0])
        if oid == BOOL.oid:
            return "t" if raw != b"\x00" else "f"
        if oid in (TEXT.oid, VARCHAR.oid, JSON.oid, 0, 19, 1042):  # name, bpchar too
            return raw.decode()
        if oid == DATE.oid:
            return str(POSTGRES_EPOCH_DATE + dt.timedelta(days=struct.unpack("!i", raw)[0]))
        if oid in (TIMESTAMP.oid, TIMESTAMPTZ.oid):
            at = POSTGRES_EPOCH + dt.timedelta(microseconds=struct.unpack("!q", raw)[0])
            return at.isoformat(sep=" ") + ("+00" if oid == TIMESTAMPTZ.oid else "")
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise ParameterError(f"a binary parameter of type {oid} is malformed: {exc}") from exc
    raise ParameterError(f"binary parameters of type OID {oid} are not supported; send it in text format")


def literal(raw: bytes | None, oid: int, fmt: int) -> str:
    """A parameter as a SQL literal for the engine: numbers checked and bare, booleans as
    TRUE/FALSE, bytes as X'..', dates and times typed, anything else a quoted string (the
    engine casts it where the query compares it with a typed column)."""
    if raw is None:
        return "NULL"
    if oid == BYTEA.oid:
        data = raw if fmt == 1 else _bytea_text(raw.decode())
        return f"X'{data.hex()}'"
    text = decode_binary(raw, oid) if fmt == 1 else raw.decode()
    if oid in (INT2.oid, INT4.oid, INT8.oid, OID.oid):
        try:
            return str(int(text))
        except ValueError as exc:
            raise ParameterError(f"{text!r} is not an integer") from exc
    if oid in (FLOAT4.oid, FLOAT8.oid, NUMERIC.oid):
        try:
            number = Decimal(text)
        except InvalidOperation as exc:
            raise ParameterError(f"{text!r} is not a number") from exc
        if not number.is_finite():
            return f"CAST({_quoted(text)} AS DOUBLE)"
        return str(number) if oid == NUMERIC.oid else f"CAST({text} AS DOUBLE)"
    if oid == BOOL.oid:
        if text.lower() not in ("t", "true", "f", "false", "1", "0", "yes", "no", "on", "off"):
            raise ParameterError(f"{text!r} is not a boolean")
        return "TRUE" if text.lower() in ("t", "true", "1", "yes", "on") else "FALSE"
    if oid == DATE.oid:
        return f"DATE {_quoted(text)}"
    if oid in (TIMESTAMP.oid, TIMESTAMPTZ.oid):
        return f"TIMESTAMP {_quoted(text)}"
    return _quoted(text)


def _bytea_text(text: str) -> bytes:
    if text.startswith("\\x"):
        try:
            return bytes.fromhex(text[2:])
        except ValueError as exc:
            raise ParameterError(f"{text!r} is not bytea hex") from exc
    return text.encode()
