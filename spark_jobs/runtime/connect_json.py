"""Debezium's JSON with schemas on (Kafka Connect's ``JsonConverter``, ``schemas.enable=true``):
each record carries its Connect schema, which says what the JSON values mean: a ``numeric(10,2)``
is base64 of the unscaled bytes with ``scale`` 2, a ``timestamp`` microseconds named
``io.debezium.time.MicroTimestamp``, and so on. The schema is turned into the Avro types the
Confluent path already maps (``spark_jobs.runtime.logical_types``), the values into what
fastavro would have given, so both formats fill a column the same way.

Used by ``debezium-json`` for tables with a column Spark's JSON reader cannot fill from Debezium's
encodings (``NEEDS_SCHEMA``); records without a schema (schemas off) are left to that reader.

Example::

    target = Target(columns=(("id", "INT"), ("amount", "DECIMAL(10, 2)")), key=("id",), envelope=True)
    read_record(key_bytes, value_bytes, target)
    # ({'id': 2, 'amount': Decimal('9.99')}, False, None)   row, is_delete, why it was rejected
    # None for a record without a schema
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Callable
from typing import Any

from spark_jobs.runtime.confluent import OPS, Rejected, Result, Row, Target, columns_reader, key_reader
from spark_jobs.runtime.logical_types import EPOCH, EPOCH_DAY

NEEDS_SCHEMA = ("DECIMAL", "DATE", "TIMESTAMP", "BINARY")  # declared types that need the record's schema
PRIMITIVES = {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float32": "float",
              "float64": "double", "boolean": "boolean", "string": "string", "bytes": "bytes"}


def needs_schema(column_type: str) -> bool:
    return column_type.upper().replace(" ", "").startswith(NEEDS_SCHEMA)


def avro_type(field: dict[str, Any]) -> dict[str, Any]:
    """A Connect schema field as the Avro type Kafka Connect's Avro converter would have written."""
    kind, name = field.get("type"), field.get("name")
    if kind == "struct":
        out: dict[str, Any] = {"type": "record", "name": name or field.get("field") or "struct",
                               "fields": [{"name": f["field"], "type": avro_type(f)} for f in field.get("fields", [])]}
    else:
        out = {"type": PRIMITIVES.get(str(kind), str(kind))}
    if name:
        out["connect.name"] = name
    return out


def _value(field: dict[str, Any], value: Any) -> Any:  # noqa: PLR0911 - one case per encoding
    """A JSON value as fastavro gives the same field of an Avro record."""
    if value is None:
        return None
    name, kind = field.get("name"), field.get("type")
    if name == "org.apache.kafka.connect.data.Decimal":
        unscaled = int.from_bytes(base64.b64decode(value, validate=True), "big", signed=True)
        return decimal.Decimal(unscaled).scaleb(-int((field.get("parameters") or {}).get("scale", 0)))
    if name == "io.debezium.data.VariableScaleDecimal":
        return {"scale": value["scale"], "value": base64.b64decode(value["value"], validate=True)}
    if name == "org.apache.kafka.connect.data.Timestamp":
        return EPOCH + dt.timedelta(milliseconds=value)
    if name == "org.apache.kafka.connect.data.Date":
        return EPOCH_DAY + dt.timedelta(days=value)
    if name == "org.apache.kafka.connect.data.Time":
        return (dt.datetime.min + dt.timedelta(milliseconds=value)).time()
    if kind == "bytes":
        return base64.b64decode(value, validate=True)
    return value


def _image_schema(schema: dict[str, Any], envelope: bool) -> dict[str, Any]:
    """The struct that holds the columns: the record itself, or Debezium's ``after``/``before``."""
    if not envelope:
        return schema
    for field in schema.get("fields", []):
        if field.get("field") in ("after", "before") and field.get("type") == "struct":
            return field
    raise Rejected("the record's schema is not a Debezium change event: it has no struct 'before' or 'after'")


_READERS: dict[tuple[bytes, Target], Callable[[dict[str, Any]], Row]] = {}  # per process, by schema


def image_reader(schema: dict[str, Any], target: Target) -> Callable[[dict[str, Any]], Row]:
    """A Connect-schema'd image (or record key, for a target without envelope) -> the table's
    columns, converted; raises ``UnmappableType`` naming a column its type cannot hold."""
    image = _image_schema(schema, target.envelope)
    fields = {f["field"]: f for f in image.get("fields", [])}
    avro = {"type": "record", "name": "image", "fields": [{"name": n, "type": avro_type(f)} for n, f in fields.items()]}
    if target.envelope:
        avro = {"type": "record", "name": "change", "fields": [{"name": "after", "type": ["null", avro]}]}
        read = columns_reader(json.dumps(avro), target)
    else:
        read = key_reader(json.dumps(avro), target)
    wanted = {name for name, _ in target.columns} & fields.keys()

    def convert(values: dict[str, Any]) -> Row:
        prepared = {}
        for name in wanted & values.keys():
            try:
                prepared[name] = _value(fields[name], values[name])
            except (ValueError, TypeError, KeyError) as exc:
                raise Rejected(f"column {name}: {values[name]!r:.40} is not what its schema says "
                               f"({fields[name].get('name') or fields[name].get('type')}): {exc}") from exc
        return read(prepared)
    return convert


def _reader_and_payload(data: bytes, target: Target) -> tuple[Callable[[dict[str, Any]], Row], Any] | None:
    """The reader of the schema the record carries and its payload; None without a schema (or
    for malformed JSON, which the JSON reader rejects with its own reason). Readers are kept
    per schema, known by the record's text before its payload (``JsonConverter`` writes the
    schema first): the schema is not serialized again for every record."""
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not (isinstance(body, dict) and isinstance(body.get("schema"), dict) and "payload" in body):
        return None
    end = data.find(b',"payload":')
    key = (data[:end] if end > 0 else json.dumps(body["schema"], sort_keys=True).encode(), target)
    reader = _READERS.get(key)
    if reader is None:
        if len(_READERS) >= 256:
            _READERS.clear()
        reader = _READERS[key] = image_reader(body["schema"], target)
    return reader, body["payload"]


def read_record(key: bytes | None, value: bytes | None, target: Target) -> Result | None:
    """Decode one record with the schema it carries; None if it carries none (schemas off)."""
    try:
        if value is None:
            keyed = _reader_and_payload(key, Target(target.columns, target.key)) if key is not None else None
            if keyed is None or not isinstance(keyed[1], dict):
                return None
            return keyed[0](keyed[1]), True, None
        found = _reader_and_payload(value, target)
        if found is None:
            return None
        read, payload = found
        op = payload.get("op") if isinstance(payload, dict) else None
        if op not in OPS:
            raise Rejected(f"unknown Debezium op {op!r} (expected one of {', '.join(OPS)})")
        side = "before" if op == "d" else "after"
        image = payload.get(side)
        if not isinstance(image, dict):
            raise Rejected(f"Debezium op {op!r} ({OPS[op]}) needs a {side!r} object")
        return read(image), op == "d", None
    except (ValueError, ArithmeticError) as exc:  # Rejected, UnmappableType, a value that does not fit, bad base64
        return None, False, str(exc)
    except (KeyError, TypeError, AttributeError) as exc:
        return None, False, f"the record does not follow its own schema ({type(exc).__name__}: {exc})"
