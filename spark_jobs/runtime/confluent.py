"""Records framed the Confluent way (a zero byte, the writer schema's 4-byte id, the Avro body),
decoded into a root table's columns: the formats ``avro-confluent`` (the record's fields are
the columns) and ``debezium-avro-confluent`` (Debezium's change envelope around them).

The table's DDL is the reader schema: a column is filled from the writer's field of the same
name, converted by ``spark_jobs.runtime.logical_types``; a column the writer lacks is NULL (a
record written before ``ALTER TABLE ... ADD COLUMN``), a field the table lacks is left out. Each
schema id is read once per process and its column converters are built once, so one barrier may
mix any number of schema ids at the cost of one lookup each.

Example::

    target = Target(columns=(("id", "INT"), ("amount", "DECIMAL(10, 2)")), key=("id",), envelope=True)
    read_record(key_bytes, value_bytes, target, known={7: schema_json}, registry_url=url)
    # ({'id': 2, 'amount': Decimal('9.99')}, False, None)   row, is_delete, why it was rejected
"""

from __future__ import annotations

import functools
import io
import json
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spark_jobs.runtime.logical_types import UnmappableType, converter
from spark_jobs.runtime.schema_registry import SchemaRegistry, UnknownSchema

OPS = {"c": "create", "r": "snapshot read", "u": "update", "d": "delete"}
Row = dict[str, Any]
Result = tuple[Row | None, bool, str | None]  # the row, whether it deletes its key, why it was rejected


@dataclass(frozen=True)
class Target:
    """The table a record is decoded for: its columns (name, Spark type), key, and envelope."""

    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...] = ()
    envelope: bool = False  # Debezium's {before, after, op, ...}


class Rejected(ValueError):
    """A record that cannot be decoded; the message is the dead letter's reason."""


def schema_id(data: bytes | None, what: str = "value") -> tuple[int, bytes]:
    """The schema id and the Avro body of a framed record."""
    if data is None or len(data) < 5:
        raise Rejected(f"record {what} of {0 if data is None else len(data)} bytes is too short for the Confluent "
                       "framing (a zero byte, a 4-byte schema id, the Avro body)")
    if data[0] != 0:
        raise Rejected(f"record {what} does not start with the Confluent framing's zero byte (got {data[0]:#04x}); "
                       "was it written by an Avro serializer with a schema registry?")
    return struct.unpack(">I", data[1:5])[0], data[5:]


@functools.lru_cache(maxsize=256)
def _parsed(schema: str) -> Any:
    import fastavro

    return fastavro.parse_schema(json.loads(schema))


def _image_fields(schema: Any, envelope: bool) -> dict[str, Any]:
    """Field name -> Avro type of the record that holds the columns (for an envelope, its row image)."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise Rejected("the writer schema is not an Avro record")
    if not envelope:
        return {f["name"]: f["type"] for f in schema["fields"]}
    for field in schema["fields"]:  # the image is defined where first used (before), then named (after)
        if field["name"] in ("before", "after"):
            for branch in field["type"] if isinstance(field["type"], list) else [field["type"]]:
                if isinstance(branch, dict) and branch.get("type") == "record":
                    return {f["name"]: f["type"] for f in branch["fields"]}
    raise Rejected("the writer schema is not a Debezium change event: it has no record 'before' or 'after'")


@functools.lru_cache(maxsize=256)
def columns_reader(schema: str, target: Target) -> Callable[[Row], Row]:
    """Row image -> the table's columns, converted; raises ``UnmappableType`` naming a column
    whose declared type cannot hold its field."""
    fields = _image_fields(json.loads(schema), target.envelope)
    converters: dict[str, Callable[[Any], Any] | None] = {
        name: converter(fields[name], name, kind) if name in fields else None for name, kind in target.columns}

    def read(image: Row) -> Row:
        row: Row = {}
        for name, convert in converters.items():
            value = image.get(name)
            row[name] = None if value is None or convert is None else convert(value)
        return row
    return read


@functools.lru_cache(maxsize=64)
def key_reader(schema: str, target: Target) -> Callable[[Row], Row]:
    """A record key (the table's key columns) -> a row holding only those columns."""
    fields = _image_fields(json.loads(schema), envelope=False)
    key_columns = tuple((name, kind) for name, kind in target.columns if name in target.key)
    missing = [name for name, _ in key_columns if name not in fields]
    if missing:
        raise Rejected(f"the record key has no field(s) {', '.join(missing)} of the table's primary key")
    read = columns_reader(schema, Target(key_columns))
    return lambda key: {name: None for name, _ in target.columns} | read(key)


def decoded(data: bytes | None, what: str, known: Mapping[int, str], registry_url: str) -> tuple[str, Any]:
    """(writer schema, record) of a framed key or value; ``Rejected`` says why it cannot be read."""
    import fastavro

    sid, body = schema_id(data, what)
    try:
        schema = known.get(sid) or SchemaRegistry(registry_url).schema(sid)
    except UnknownSchema as exc:
        raise Rejected(str(exc)) from exc
    buffer = io.BytesIO(body)
    try:
        record = fastavro.schemaless_reader(buffer, _parsed(schema), None)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is the reason we report
        raise Rejected(f"cannot decode the record {what} with schema id {sid}: {type(exc).__name__}: {exc}") from exc
    if buffer.tell() != len(body):
        raise Rejected(f"the record {what} has {len(body) - buffer.tell()} bytes left over after schema id {sid}")
    return schema, record


def transaction_id(value: bytes | None, known: Mapping[int, str], registry_url: str) -> str | None:
    """The ``transaction.id`` of a Debezium change event (None outside a transaction, for a
    tombstone, or when the record cannot be decoded: its barrier rejects it with the reason)."""
    if value is None:
        return None
    try:
        record = decoded(value, "value", known, registry_url)[1]
    except Rejected:
        return None
    tx = record.get("transaction") if isinstance(record, dict) else None
    return str(tx["id"]) if isinstance(tx, dict) and tx.get("id") is not None else None


def read_record(key: bytes | None, value: bytes | None, target: Target, known: Mapping[int, str],
                registry_url: str) -> Result:
    """Decode one record; ``known`` holds the schemas the driver fetched for this barrier (ids
    missing from it are asked of the registry). A registry that does not answer raises
    ``RegistryUnavailable``: the barrier fails and is tried again, no record is dropped."""
    try:
        if value is None:
            if not target.envelope:
                raise Rejected("empty record value (a Kafka tombstone); format avro-confluent needs an Avro record")
            schema, record = decoded(key, "key", known, registry_url)
            return key_reader(schema, target)(record), True, None
        schema, record = decoded(value, "value", known, registry_url)
        if not target.envelope:
            return columns_reader(schema, target)(record), False, None
        op = record.get("op")
        if op not in OPS:
            raise Rejected(f"Debezium op {op!r} is not applied (expected one of {', '.join(OPS)})")
        image = record.get("before" if op == "d" else "after")
        if not isinstance(image, dict):
            raise Rejected(f"Debezium op {op!r} ({OPS[op]}) needs the row in {'before' if op == 'd' else 'after'!r}")
        return columns_reader(schema, target)(image), op == "d", None
    except (Rejected, UnmappableType, ValueError, ArithmeticError) as exc:
        return None, False, str(exc)
