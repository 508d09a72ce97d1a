"""Every type a default Debezium PostgreSQL connector writes, into the Spark types a table may
declare for it; the field schemas are the ones the connector registered in a real run
(tests/lockstep/dev/test_connect.py starts that stack)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from spark_jobs.runtime.logical_types import UnmappableType, converter, semantic

UTC = dt.UTC


def debezium(primitive: str, name: str, **extra: Any) -> list[Any]:
    """A nullable field as the Avro converter writes it: ``["null", {type, connect.name, ...}]``."""
    return ["null", {"type": primitive, "connect.version": 1, "connect.name": name, **extra}]


DECIMAL_10_2 = debezium("bytes", "org.apache.kafka.connect.data.Decimal", scale=2, precision=10, logicalType="decimal")
VARIABLE = ["null", {"type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data",
                     "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
                     "connect.name": "io.debezium.data.VariableScaleDecimal"}]


@pytest.mark.parametrize(("field", "spark_type", "value", "expected"), [
    (DECIMAL_10_2, "DECIMAL(10, 2)", Decimal("12.34"), Decimal("12.34")),
    (DECIMAL_10_2, "DECIMAL(12, 4)", Decimal("12.34"), Decimal("12.3400")),
    (DECIMAL_10_2, "DOUBLE", Decimal("12.34"), 12.34),
    (DECIMAL_10_2, "STRING", Decimal("12.34"), "12.34"),
    (VARIABLE, "DECIMAL(20, 5)", {"scale": 5, "value": (314159).to_bytes(3, "big", signed=True)}, Decimal("3.14159")),
    (VARIABLE, "DECIMAL(20, 5)", {"scale": 0, "value": (-7).to_bytes(1, "big", signed=True)}, Decimal("-7.00000")),
    (VARIABLE, "STRING", {"scale": 2, "value": (-150).to_bytes(2, "big", signed=True)}, "-1.50"),
    (debezium("int", "io.debezium.time.Date"), "DATE", 19782, dt.date(2024, 2, 29)),
    (debezium("int", "io.debezium.time.Date"), "STRING", -1, "1969-12-31"),
    (debezium("long", "io.debezium.time.MicroTimestamp"), "TIMESTAMP", 1704164645123456,
     dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
    (debezium("long", "io.debezium.time.MicroTimestamp"), "TIMESTAMP_NTZ", 1704164645123456,
     dt.datetime(2024, 1, 2, 3, 4, 5, 123456)),
    (debezium("long", "io.debezium.time.Timestamp"), "TIMESTAMP", 1704164645123,
     dt.datetime(2024, 1, 2, 3, 4, 5, 123000, tzinfo=UTC)),
    (debezium("long", "io.debezium.time.NanoTimestamp"), "TIMESTAMP", 1704164645123456789,
     dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
    (debezium("string", "io.debezium.time.ZonedTimestamp"), "TIMESTAMP", "2024-01-02T01:04:05.000000Z",
     dt.datetime(2024, 1, 2, 1, 4, 5, tzinfo=UTC)),
    (debezium("string", "io.debezium.time.ZonedTimestamp"), "TIMESTAMP", "2024-01-02T03:04:05+02:00",
     dt.datetime(2024, 1, 2, 1, 4, 5, tzinfo=UTC)),
    (debezium("long", "io.debezium.time.MicroTime"), "STRING", 45296789000, "12:34:56.789000"),
    (debezium("long", "io.debezium.time.MicroTime"), "BIGINT", 45296789000, 45296789000),
    (debezium("int", "io.debezium.time.Time"), "BIGINT", 45296789, 45296789000),
    (debezium("long", "io.debezium.time.MicroDuration"), "BIGINT", 93600000000, 93600000000),
    (debezium("string", "io.debezium.data.Uuid"), "STRING", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
     "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    (debezium("string", "io.debezium.data.Json"), "STRING", '{"a": 1}', '{"a": 1}'),
    (debezium("string", "io.debezium.data.Enum", **{"connect.parameters": {"allowed": "new,paid"}}), "STRING", "paid", "paid"),
    (["null", "int"], "SMALLINT", -5, -5),
    (["null", "long"], "DECIMAL(20, 0)", 12, Decimal("12")),
    ("boolean", "BOOLEAN", True, True),
    ("double", "DOUBLE", 1.5, 1.5),
    (["null", "bytes"], "BINARY", b"\x00\x01", b"\x00\x01"),
    (["null", {"type": "int", "logicalType": "date"}], "DATE", dt.date(2024, 2, 29), dt.date(2024, 2, 29)),
])
def test_a_source_type_fills_each_spark_type_it_can(field: Any, spark_type: str, value: Any, expected: Any) -> None:
    got = converter(field, "c", spark_type)(value)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("field", "spark_type", "offer"), [
    (debezium("long", "io.debezium.time.MicroTimestamp"), "BIGINT", "TIMESTAMP or TIMESTAMP_NTZ"),
    (debezium("string", "io.debezium.data.Uuid"), "BINARY", "STRING"),
    (DECIMAL_10_2, "INT", "DOUBLE or DECIMAL(38,10) or STRING"),
    (debezium("string", "io.debezium.data.geometry.Point"), "STRING", "no Spark type"),
    (["null", "string"], "DATE", "STRING"),
    (debezium("long", "io.debezium.time.MicroDuration"), "INTERVAL DAY TO SECOND", "BIGINT"),  # not in Delta
])
def test_a_pair_that_cannot_map_is_refused_naming_the_column_and_what_would_do(
        field: Any, spark_type: str, offer: str) -> None:
    with pytest.raises(UnmappableType) as info:
        converter(field, "placed_at", spark_type)
    assert str(info.value).startswith("column placed_at: the source writes") and offer in str(info.value)


@pytest.mark.parametrize(("value", "spark_type", "why"), [
    (Decimal("123456789.12"), "DECIMAL(10, 2)", "more than 10 digits"),
    (Decimal("1.234"), "DECIMAL(10, 2)", "more than 2 decimal places"),
    (Decimal("NaN"), "DECIMAL(10, 2)", "is not a number"),
])
def test_a_value_that_does_not_fit_says_so_and_how_to_widen_the_column(value: Decimal, spark_type: str, why: str) -> None:
    field = debezium("bytes", "org.apache.kafka.connect.data.Decimal", scale=3, precision=12, logicalType="decimal")
    with pytest.raises(ValueError, match=why):
        converter(field, "amount", spark_type)(value)
    with pytest.raises(ValueError, match="does not fit SMALLINT"):
        converter("int", "n", "SMALLINT")(70000)


def test_the_meaning_of_a_field_is_its_connect_name_else_its_logical_type() -> None:
    assert semantic(DECIMAL_10_2) == ("bytes", "org.apache.kafka.connect.data.Decimal")
    assert semantic(["null", {"type": "int", "logicalType": "date"}]) == ("int", "date")
    assert semantic(["null", "string"]) == ("string", "")
    assert semantic(["null", "int", "string"]) == ("union", "")
