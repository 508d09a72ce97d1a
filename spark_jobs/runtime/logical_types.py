"""From an Avro field as Debezium and Kafka Connect write it to the Spark type a table declares.

Debezium carries a database's types as Avro primitives named by Kafka Connect: a Postgres
``timestamp`` is a ``long`` named ``io.debezium.time.MicroTimestamp`` (microseconds of the wall
clock, as if it were UTC), a ``numeric(10,2)`` is ``bytes`` with Avro's ``decimal`` logical type,
a ``numeric`` without a scale a ``{scale, value}`` record, and so on. ``converter`` reads the
writer's field once and returns the function that turns each decoded value (as fastavro gives
it) into what a Spark column of the declared type holds; a pair it cannot map is refused with
the column's name and the types it could be declared as.

Pure standard library, so the mapping is tested without Spark.

Example::

    to_column = converter({"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}, "placed", "TIMESTAMP")
    to_column(1704164645123456)      # datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc)
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Callable
from typing import Any

Convert = Callable[[Any], Any]
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
EPOCH_DAY = dt.date(1970, 1, 1)
INT_RANGES = {"TINYINT": 8, "SMALLINT": 16, "INT": 32, "BIGINT": 64}
DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)")


class UnmappableType(ValueError):
    """A column's declared type cannot hold what the source writes in that field."""


def semantic(field_type: Any) -> tuple[str, str]:
    """The Avro primitive of a (nullable) field and its meaning: Kafka Connect's ``connect.name``,
    else Avro's ``logicalType``, else ``""``."""
    if isinstance(field_type, list):
        branches = [t for t in field_type if t != "null"]
        if len(branches) != 1:
            return "union", ""
        field_type = branches[0]
    if isinstance(field_type, str):
        return field_type, ""
    if not isinstance(field_type, dict):
        return "unknown", ""
    name = field_type.get("connect.name") or field_type.get("logicalType") or ""
    kind = field_type.get("type")
    if kind == "record" and not name:
        name = field_type.get("name", "")
    return (kind if isinstance(kind, str) else "complex"), str(name)


def _micros(value: int, per_second: int) -> int:
    return value * (1_000_000 // per_second) if per_second <= 1_000_000 else value // (per_second // 1_000_000)


def _instant(per_second: int) -> Convert:
    return lambda v: EPOCH + dt.timedelta(microseconds=_micros(v, per_second))


def _wall_clock(per_second: int) -> Convert:
    return lambda v: (EPOCH + dt.timedelta(microseconds=_micros(v, per_second))).replace(tzinfo=None)


def _time_of_day(per_second: int) -> Convert:
    def convert(v: Any) -> str:
        micros = _micros(v, per_second) if isinstance(v, int) else (
            ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond)
        return (dt.datetime.min + dt.timedelta(microseconds=micros)).time().isoformat()
    return convert


def _zoned(v: str) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _variable_decimal(v: dict[str, Any]) -> decimal.Decimal:
    return decimal.Decimal(int.from_bytes(v["value"], "big", signed=True)).scaleb(-int(v["scale"]))


def _exact_decimal(precision: int, scale: int, column: str) -> Convert:
    quantum = decimal.Decimal(1).scaleb(-scale)
    wide = decimal.Context(prec=max(precision, 1) + 40)  # quantize exactly; the checks below decide

    def convert(v: decimal.Decimal) -> decimal.Decimal:
        if not v.is_finite():
            raise ValueError(f"column {column}: {v} is not a number a DECIMAL({precision},{scale}) holds")
        fitted = v.quantize(quantum, context=wide)
        if fitted != v:
            raise ValueError(f"column {column}: {v} has more than {scale} decimal places; declare DECIMAL(p,s) "
                             "with a larger s")
        if len(fitted.as_tuple().digits) > precision and fitted != 0:
            raise ValueError(f"column {column}: {v} has more than {precision} digits; declare a larger precision")
        return fitted
    return convert


def _integer(bits: int, column: str, kind: str) -> Convert:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def convert(v: int) -> int:
        if not low <= v <= high:
            raise ValueError(f"column {column}: {v} does not fit {kind}")
        return v
    return convert


def _same(v: Any) -> Any:
    return v


# meaning -> how it reads as a number, a string, ...: one table of what each source type can fill
TIMESTAMPS = {"io.debezium.time.Timestamp": 1_000, "io.debezium.time.MicroTimestamp": 1_000_000,
              "io.debezium.time.NanoTimestamp": 1_000_000_000, "org.apache.kafka.connect.data.Timestamp": 0,
              "timestamp-millis": 0, "timestamp-micros": 0}
TIMES = {"io.debezium.time.Time": 1_000, "io.debezium.time.MicroTime": 1_000_000,
         "io.debezium.time.NanoTime": 1_000_000_000, "org.apache.kafka.connect.data.Time": 0,
         "time-millis": 0, "time-micros": 0}
DATES = {"io.debezium.time.Date", "org.apache.kafka.connect.data.Date", "date"}
DECIMALS = {"org.apache.kafka.connect.data.Decimal", "decimal"}
TEXTS = {"io.debezium.data.Uuid", "uuid", "io.debezium.data.Json", "io.debezium.data.Enum",
         "io.debezium.data.EnumSet", "io.debezium.data.Xml", "io.debezium.data.Ltree", "io.debezium.time.ZonedTime",
         "io.debezium.time.Interval"}


def converter(field_type: Any, column: str, spark_type: str) -> Convert:
    """The function from a decoded field value (never None) to the column's value; raises
    ``UnmappableType`` if the column's type cannot hold this field. The function itself raises
    ``ValueError`` (with the column's name) for a value that does not fit, e.g. too many digits."""
    primitive, meaning = semantic(field_type)
    target = spark_type.upper().replace(" ", "")
    target = "DECIMAL(10,0)" if target == "DECIMAL" else target  # Spark's default precision and scale
    found = _choose(primitive, meaning, column, target)
    if found is None:
        source = f"{primitive} ({meaning})" if meaning else primitive
        raise UnmappableType(f"column {column}: the source writes {source}, which Lockstep cannot put in a "
                             f"{spark_type} column; declare it as {' or '.join(_choices(primitive, meaning))}")
    return found


def _choices(primitive: str, meaning: str) -> list[str]:
    return [kind for kind in ("BOOLEAN", "INT", "BIGINT", "DOUBLE", "DECIMAL(38,10)", "STRING", "BINARY", "DATE",
                              "TIMESTAMP", "TIMESTAMP_NTZ")
            if _choose(primitive, meaning, "", kind) is not None] or ["(no Spark type: leave the column out)"]


def _choose(primitive: str, meaning: str, column: str, target: str) -> Convert | None:  # noqa: C901, PLR0911, PLR0912
    """The conversion for one (source, target) pair, or None if there is none."""
    if (match := DECIMAL.fullmatch(target)) is not None:
        exact = _exact_decimal(int(match.group(1)), int(match.group(2)), column)
        if meaning in DECIMALS:
            return exact
        if meaning == "io.debezium.data.VariableScaleDecimal":
            return lambda v: exact(_variable_decimal(v))
        if not meaning and primitive in ("int", "long"):
            return lambda v: exact(decimal.Decimal(v))
        return None
    if meaning in TIMESTAMPS:
        per_second = TIMESTAMPS[meaning]
        if target == "TIMESTAMP":
            return _instant(per_second) if per_second else (lambda v: v)
        if target == "TIMESTAMP_NTZ":
            return _wall_clock(per_second) if per_second else (lambda v: v.replace(tzinfo=None))
        return None
    if meaning == "io.debezium.time.ZonedTimestamp":
        return _zoned if target == "TIMESTAMP" else (_same if target == "STRING" else None)
    if meaning in DATES:
        if target == "DATE":
            return (lambda v: EPOCH_DAY + dt.timedelta(days=v)) if meaning.startswith("io.") else _same
        if target == "STRING":
            return (lambda v: (EPOCH_DAY + dt.timedelta(days=v)).isoformat()) if meaning.startswith("io.") else (
                lambda v: v.isoformat())
        return None
    if meaning in TIMES:
        per_second = TIMES[meaning] or 1_000_000
        if target == "STRING":
            return _time_of_day(per_second)
        if target == "BIGINT" and TIMES[meaning]:
            return lambda v: _micros(v, per_second)  # microseconds since midnight
        return None
    if meaning == "io.debezium.time.MicroDuration":  # Delta tables hold no interval types
        return _same if target == "BIGINT" else None  # microseconds (a month is 30.4375 days, as Debezium counts)
    if meaning in DECIMALS or meaning == "io.debezium.data.VariableScaleDecimal":
        plain = _variable_decimal if meaning.startswith("io.") else _same
        if target == "DOUBLE":
            return lambda v: float(plain(v))
        if target == "STRING":
            return lambda v: str(plain(v))
        return None
    if meaning in TEXTS or (primitive == "string" and not meaning):
        return _same if target == "STRING" else None
    if meaning and meaning not in ("io.debezium.data.Bits",):
        return None  # a named type this table does not know: refuse rather than guess
    if primitive == "bytes":
        return _same if target == "BINARY" else None
    if primitive == "boolean":
        return _same if target == "BOOLEAN" else (str if target == "STRING" else None)
    if primitive in ("int", "long"):
        if target in INT_RANGES:
            return _integer(INT_RANGES[target], column, target)
        if target in ("DOUBLE", "FLOAT"):
            return float
        return str if target == "STRING" else None
    if primitive in ("float", "double"):
        return float if target in ("DOUBLE", "FLOAT") else (str if target == "STRING" else None)
    return None
