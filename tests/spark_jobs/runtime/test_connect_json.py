"""Debezium's JSON with schemas on, read with the schema each record carries (pure Python: the
same conversions the Avro path makes; tests/spark_jobs/runtime/test_formats.py runs both
against a real connector)."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from typing import Any

from spark_jobs.runtime.confluent import Target
from spark_jobs.runtime.connect_json import needs_schema, read_record

FIELDS = [
    {"field": "id", "type": "int32", "optional": False},
    {"field": "amount", "type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "2", "connect.decimal.precision": "10"}},
    {"field": "ratio", "type": "struct", "optional": True, "name": "io.debezium.data.VariableScaleDecimal",
     "fields": [{"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}]},
    {"field": "placed", "type": "int32", "optional": True, "name": "io.debezium.time.Date"},
    {"field": "seen", "type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp"},
    {"field": "seen_tz", "type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp"},
    {"field": "at_time", "type": "int64", "optional": True, "name": "io.debezium.time.MicroTime"},
    {"field": "raw", "type": "bytes", "optional": True},
]
TARGET = Target((("id", "INT"), ("amount", "DECIMAL(10,2)"), ("ratio", "DECIMAL(20,5)"), ("placed", "DATE"),
                 ("seen", "TIMESTAMP_NTZ"), ("seen_tz", "TIMESTAMP"), ("at_time", "STRING"), ("raw", "BINARY")),
                ("id",), envelope=True)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def event(op: str, image: dict[str, Any], fields: list[dict[str, Any]] = FIELDS) -> bytes:
    row = {"type": "struct", "optional": True, "name": "src.public.orders.Value", "field": "after", "fields": fields}
    schema = {"type": "struct", "name": "src.public.orders.Envelope",
              "fields": [{**row, "field": "before"}, row, {"field": "op", "type": "string"}]}
    side = "before" if op == "d" else "after"
    return json.dumps({"schema": schema, "payload": {"before": None, "after": None, side: image, "op": op}}).encode()


def test_every_encoding_of_a_postgres_row_becomes_the_declared_column_type() -> None:
    image = {"id": 1, "amount": b64((1234).to_bytes(2, "big")), "ratio": {"scale": 5, "value": b64((314159).to_bytes(3, "big"))},
             "placed": 19782, "seen": 1704164645123456, "seen_tz": "2024-01-02T01:04:05Z", "at_time": 45296789000,
             "raw": b64(b"\x00\xff")}
    row, is_delete, error = read_record(b'{"id": 1}', event("u", image), TARGET)  # type: ignore[misc]
    assert error is None and not is_delete
    assert row == {"id": 1, "amount": Decimal("12.34"), "ratio": Decimal("3.14159"), "placed": dt.date(2024, 2, 29),
                   "seen": dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
                   "seen_tz": dt.datetime(2024, 1, 2, 1, 4, 5, tzinfo=dt.UTC), "at_time": "12:34:56.789000", "raw": b"\x00\xff"}
    negative = read_record(None, event("d", {**image, "amount": b64((-5).to_bytes(1, "big", signed=True))}), TARGET)
    assert negative is not None and negative[0] is not None and negative[0]["amount"] == Decimal("-0.05") and negative[1]


def test_a_tombstone_deletes_the_key_its_schema_d_key_names_and_records_without_a_schema_are_left_to_spark() -> None:
    key = json.dumps({"schema": {"type": "struct", "fields": [{"field": "id", "type": "int32"}]}, "payload": {"id": 7}})
    row, is_delete, error = read_record(key.encode(), None, TARGET)  # type: ignore[misc]
    assert (row["id"], row["amount"], is_delete, error) == (7, None, True, None)
    assert read_record(b"{}", json.dumps({"before": None, "after": {"id": 1}, "op": "c"}).encode(), TARGET) is None
    assert read_record(b"{}", b"{not json", TARGET) is None  # Spark's JSON reader rejects it, with its reason


def test_what_does_not_fit_is_rejected_with_a_reason_naming_the_column() -> None:
    too_precise = read_record(None, event("c", {"id": 1, "amount": b64((123456).to_bytes(3, "big"))},
                                          [{**FIELDS[1], "parameters": {"scale": "4"}}, FIELDS[0]]), TARGET)
    assert too_precise == (None, False, "column amount: 12.3456 has more than 2 decimal places; declare DECIMAL(p,s) "
                                        "with a larger s")
    unmappable = read_record(None, event("c", {"id": 1, "placed": "soon"}, [FIELDS[0], {**FIELDS[3], "type": "string",
                                                                                      "name": None}]), TARGET)
    assert unmappable is not None and str(unmappable[2]).startswith("column placed: the source writes string")
    bad = read_record(None, event("c", {"id": 1, "amount": "%%%"}), TARGET)
    assert bad is not None and bad[0] is None and str(bad[2]).startswith("column amount: '%%%' is not what its schema "
                                                                          "says (org.apache.kafka.connect.data.Decimal)")
    unknown_op = read_record(None, event("x", {"id": 1}), TARGET)
    assert unknown_op == (None, False, "unknown Debezium op 'x' (expected one of c, r, u, d)")
    kinds = ("DECIMAL(10, 2)", "date", "TIMESTAMP_NTZ", "BIGINT", "STRING")
    assert [needs_schema(t) for t in kinds] == [True, True, True, False, False]
