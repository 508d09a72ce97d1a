"""Decoding Confluent-framed Avro into a table's columns: Debezium's envelope and plain records,
several schema ids (a column added at the source), tombstones, and records that are rejected
with their reason. Records are framed here with the schemas a real Debezium connector
registered (pure logic: the registry's part is tested in tests/spark_jobs/runtime/test_formats.py)."""

from __future__ import annotations

import datetime as dt
import io
import json
import struct
from decimal import Decimal
from typing import Any

import fastavro
import pytest

from spark_jobs.runtime.confluent import Target, read_record

DECIMAL = {"type": "bytes", "scale": 2, "precision": 10, "connect.name": "org.apache.kafka.connect.data.Decimal",
           "logicalType": "decimal"}


def envelope(*extra_fields: dict[str, Any]) -> dict[str, Any]:
    """Debezium's envelope of table ``orders`` (as registered with schema.name.adjustment.mode=avro)."""
    value = {"type": "record", "name": "Value", "fields": [
        {"name": "id", "type": "int"},
        {"name": "amount", "type": ["null", DECIMAL], "default": None},
        {"name": "placed", "type": ["null", {"type": "int", "connect.name": "io.debezium.time.Date"}], "default": None},
        *extra_fields]}
    return {"type": "record", "name": "Envelope", "namespace": "shop.public.orders", "fields": [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None}]}


KEY = {"type": "record", "name": "Key", "namespace": "shop.public.orders", "fields": [{"name": "id", "type": "int"}]}
NOTE = {"name": "note", "type": ["null", "string"], "default": None}
SCHEMAS = {2: json.dumps(envelope()), 7: json.dumps(envelope(NOTE)), 3: json.dumps(KEY)}
ORDERS = Target(columns=(("id", "INT"), ("amount", "DECIMAL(10, 2)"), ("placed", "DATE"), ("note", "STRING")),
                key=("id",), envelope=True)


def framed(schema_id: int, record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    out.write(b"\x00" + struct.pack(">I", schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(json.loads(SCHEMAS[schema_id])), record)
    return out.getvalue()


def change(schema_id: int, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> bytes:
    return framed(schema_id, {"before": before, "after": after, "op": op, "ts_ms": 1})


def read(key: bytes | None, value: bytes | None, target: Target = ORDERS) -> tuple[Any, ...]:
    return read_record(key, value, target, SCHEMAS, registry_url="http://127.0.0.1:9/unused")


def test_each_op_of_the_envelope_becomes_an_upsert_or_a_delete() -> None:
    row = {"id": 1, "amount": Decimal("2.50"), "placed": 19782}
    snapshot = read(None, change(2, "r", None, row))
    assert snapshot == ({"id": 1, "amount": Decimal("2.50"), "placed": dt.date(2024, 2, 29),
                         "note": None}, False, None)
    assert read(None, change(2, "u", None, {**row, "amount": Decimal("9.99")}))[0]["amount"] == Decimal("9.99")
    deleted = read(None, change(2, "d", {"id": 1, "amount": None, "placed": None}, None))
    assert deleted[:2] == ({"id": 1, "amount": None, "placed": None, "note": None}, True)
    tombstone = read(framed(3, {"id": 1}), None)  # the key, framed with its own schema id
    assert tombstone == ({"id": 1, "amount": None, "placed": None, "note": None}, True, None)


def test_records_of_several_schema_ids_fill_the_same_columns() -> None:
    old = read(None, change(2, "c", None, {"id": 1, "amount": None, "placed": None}))
    new = read(None, change(7, "c", None, {"id": 2, "amount": None, "placed": None, "note": "new"}))
    assert old[0]["note"] is None and new[0]["note"] == "new"
    narrow = Target(columns=(("id", "INT"),), key=("id",), envelope=True)  # a field the table lacks is left out
    assert read(None, change(7, "c", None, {"id": 2, "amount": None, "placed": None, "note": "x"}), narrow)[0] == {"id": 2}


def test_a_plain_record_is_the_row() -> None:
    SCHEMAS[5] = json.dumps({"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"}, {"name": "amount", "type": DECIMAL}]})
    plain = Target(columns=(("id", "BIGINT"), ("amount", "DECIMAL(12, 2)")))
    assert read(None, framed(5, {"id": 7, "amount": Decimal("1.25")}), plain) == (
        {"id": 7, "amount": Decimal("1.25")}, False, None)
    assert "tombstone" in read(b"k", None, plain)[2]


@pytest.mark.parametrize(("key", "value", "reason"), [
    (None, b"{\"id\": 1}", "does not start with the Confluent framing's zero byte"),
    (None, b"\x00\x00", "too short for the Confluent framing"),
    (None, b"\x00\x00\x00\x00\x02\xff\xff\xff", "cannot decode the record value with schema id 2"),
    (None, change(2, "t", None, None), "Debezium op 't' is not applied"),
    (None, change(2, "c", None, None), "needs the row in 'after'"),
    (None, change(2, "c", None, {"id": 1, "amount": Decimal("12345678.90"), "placed": None}), None),
    (b"\x00\x00\x00\x00\x03", None, "cannot decode the record key"),
])
def test_a_record_that_cannot_be_read_is_rejected_with_its_reason(key: bytes | None, value: bytes | None,
                                                                  reason: str | None) -> None:
    row, _, why = read(key, value)
    if reason is None:  # fits: 10 digits
        assert why is None and row is not None
    else:
        assert row is None and why is not None and reason in why


def test_a_value_too_wide_for_its_column_is_rejected_naming_the_column() -> None:
    narrow = Target(columns=(("id", "INT"), ("amount", "DECIMAL(4, 2)")), key=("id",), envelope=True)
    _, _, why = read(None, change(2, "c", None, {"id": 1, "amount": Decimal("123.45"), "placed": None}), narrow)
    assert why is not None and why.startswith("column amount: 123.45 has more than 4 digits")
    wrong = Target(columns=(("id", "INT"), ("placed", "BIGINT")), key=("id",), envelope=True)
    _, _, why = read(None, change(2, "c", None, {"id": 1, "amount": None, "placed": 3}), wrong)
    assert why is not None and why.startswith("column placed: the source writes int (io.debezium.time.Date)")
