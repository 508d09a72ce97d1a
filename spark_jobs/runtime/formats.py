"""Record formats of root tables: Kafka bytes -> rows of the table, or a reason to reject.

``decode`` turns the Kafka columns (key, value, topic, partition, offset, timestamp) into
``row`` (a struct of the table's columns), ``is_delete`` and ``is_bad``; ``reason`` says, for a
rejected record, why — in words a person can act on. Formats:

* ``json``: one JSON object per record, fields named like the columns.
* ``debezium-json``: Debezium change events ``{"before", "after", "op"}`` (optionally inside the
  ``{"schema", "payload"}`` envelope). Ops ``c``, ``r``, ``u`` upsert ``after``; ``d`` deletes
  ``before``; a tombstone (null value) deletes the key given by the record key.
* ``avro``: Avro binary (no header) written with the table's ``avro_schema``, decoded with
  fastavro so that each rejected record gets the decoder's own reason.
* ``avro-confluent`` and ``debezium-avro-confluent``: Avro framed the Confluent way (zero byte,
  4-byte schema id, body), the writer schema fetched from ``LOCKSTEP_SCHEMA_REGISTRY_URL`` by id;
  the second is Debezium's change envelope (see ``spark_jobs.runtime.confluent``), with logical
  types mapped to the declared Spark types (``spark_jobs.runtime.logical_types``).
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from coordinator.domain.errors import UsageError
from spark_jobs.planning.pipeline import RootTable
from spark_jobs.runtime import connect_json
from spark_jobs.runtime.confluent import Target, columns_reader, read_record
from spark_jobs.runtime.connect_json import needs_schema
from spark_jobs.runtime.logical_types import UnmappableType
from spark_jobs.runtime.schema_registry import RegistryError, RegistryUnavailable, SchemaRegistry

CORRUPT = "_lockstep_corrupt"
DEBEZIUM_OPS = {"c": "create", "r": "snapshot read", "u": "update", "d": "delete"}
CONFLUENT = {"avro-confluent": False, "debezium-avro-confluent": True}  # format -> Debezium's envelope
DELETING = {"debezium-json", "debezium-avro-confluent"}  # formats whose records may delete their key
INTEGRAL = {"TINYINT", "SMALLINT", "INT", "BIGINT"}
FRACTIONAL = {"FLOAT", "DOUBLE"}


def fits(kind: str, value: object) -> bool:
    """Whether a JSON value can fill a column of Spark type ``kind`` (other types: not checked)."""
    if kind == "BOOLEAN":
        return isinstance(value, bool)
    if kind == "STRING":
        return isinstance(value, str)
    if kind in INTEGRAL:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in FRACTIONAL:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind.startswith("DECIMAL"):
        return isinstance(value, int | float | str)
    return True


def decode(raw: DataFrame, table: RootTable, schemas: Mapping[int, str] | None = None,
           registry_url: str = "") -> DataFrame:
    """Add ``row``, ``is_delete`` and ``is_bad`` to the Kafka columns of ``raw``; the Confluent
    formats use the writer ``schemas`` the driver fetched (id -> JSON) and ask ``registry_url``
    for others."""
    if table.format in CONFLUENT:
        decoded = _confluent(raw, table, dict(schemas or {}), registry_url)
    elif table.format == "json":
        decoded = _json(raw, table)
    elif table.format == "debezium-json":
        decoded = _debezium(raw, table)
    elif table.format == "avro":
        decoded = _avro(raw, table)
    else:
        raise ValueError(f"format {table.format} has no decoder")
    missing_key: Column = F.lit(False)
    for key in table.primary_key:
        missing_key = missing_key | F.col(f"row.{key}").isNull()
    bad = F.coalesce(F.col("is_bad") | F.col("row").isNull() | missing_key, F.lit(True))
    return decoded.withColumn("is_bad", bad)


def _json_schema(table: RootTable) -> str:
    return f"{table.schema_ddl}, {CORRUPT} STRING"


def _json(raw: DataFrame, table: RootTable) -> DataFrame:
    parsed = F.from_json(F.col("value").cast("string"), _json_schema(table),
                         {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    row = F.struct(*[parsed[c.name].alias(c.name) for c in table.columns])
    return raw.select("*", row.alias("row"), F.lit(False).alias("is_delete"),
                      (F.col("value").isNull() | parsed.isNull() | parsed[CORRUPT].isNotNull()).alias("is_bad"))


def _struct(columns: list[tuple[str, str]]) -> str:
    return f"STRUCT<{', '.join(f'`{name}`: {kind}' for name, kind in columns)}>"


def _debezium(raw: DataFrame, table: RootTable) -> DataFrame:
    image = _struct([(c.name, c.type) for c in table.columns])
    change = f"before {image}, after {image}, op STRING"
    envelope = f"STRUCT<before: {image}, after: {image}, op: STRING>"
    key_columns = [(c.name, c.type) for c in table.columns if c.name in table.primary_key]
    key_ddl = ", ".join(f"`{name}` {kind}" for name, kind in key_columns)
    parsed = raw.select(
        "*",
        F.from_json(F.col("value").cast("string"), f"{change}, payload {envelope}, {CORRUPT} STRING",
                    {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}).alias("_event"),
        F.from_json(F.col("key").cast("string"), f"{key_ddl}, payload {_struct(key_columns)}").alias("_key"),
    )
    event, key = F.col("_event"), F.col("_key")
    body = F.when(event["payload"].isNotNull(), event["payload"]).otherwise(
        F.struct(event["before"].alias("before"), event["after"].alias("after"), event["op"].alias("op")))
    parsed = parsed.withColumn("_body", body)
    op = F.col("_body.op")
    tombstone = F.struct(*[  # a tombstone deletes the key given in the record key
        (F.coalesce(key["payload"][c.name], key[c.name]) if c.name in table.primary_key else F.lit(None).cast(c.type))
        .alias(c.name) for c in table.columns
    ])
    row = F.when(F.col("value").isNull(), tombstone).when(op == "d", F.col("_body.before")).when(
        op.isin("c", "r", "u"), F.col("_body.after"))
    known = F.coalesce(op.isin(*DEBEZIUM_OPS), F.lit(False))
    bad = F.col("value").isNotNull() & (event.isNull() | event[CORRUPT].isNotNull() | ~known)
    is_delete = F.col("value").isNull() | (op == "d")
    if any(needs_schema(c.type) for c in table.columns):  # read with the schema each record carries, if it does
        target = _typed_target(table)
        typed = F.udf(lambda k, v: connect_json.read_record(k, v, target),
                      f"row {_struct(list(target.columns))}, is_delete BOOLEAN, error STRING")
        parsed = parsed.withColumn("_typed", typed(F.col("key"), F.col("value")))
        schemaed = F.col("_typed").isNotNull()
        row = F.when(schemaed, F.col("_typed.row")).otherwise(row)
        is_delete = F.when(schemaed, F.coalesce(F.col("_typed.is_delete"), F.lit(False))).otherwise(is_delete)
        bad = F.when(schemaed, F.col("_typed.error").isNotNull()).otherwise(bad)
    return parsed.select(*raw.columns, row.alias("row"), is_delete.alias("is_delete"), bad.alias("is_bad"))


@functools.lru_cache(maxsize=8)
def _avro_schema(text: str) -> Any:
    import fastavro

    return fastavro.parse_schema(json.loads(text))


def read_avro(value: bytes | None, schema: str, columns: tuple[tuple[str, str], ...]) -> tuple[dict | None, str | None]:
    """Decode one Avro record into the table's columns, or say why it cannot be."""
    import fastavro

    if value is None:
        return None, "empty record value (a Kafka tombstone); a root table of format avro needs an Avro record"
    buffer = io.BytesIO(value)
    try:
        record = fastavro.schemaless_reader(buffer, _avro_schema(schema), None)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is the reason we report
        return None, f"cannot decode as Avro with the table's schema: {type(exc).__name__}: {exc}"
    if buffer.tell() != len(value):
        return None, f"cannot decode as Avro with the table's schema: {len(value) - buffer.tell()} bytes left over"
    if not isinstance(record, dict):
        return None, "the Avro schema must be a record"
    for name, kind in columns:
        v = record.get(name)
        if v is not None and not fits(kind.upper(), v):
            return None, f"field {name}: expected {kind}, got {type(v).__name__}"
    return {name: record.get(name) for name, _ in columns}, None


def _avro(raw: DataFrame, table: RootTable) -> DataFrame:
    columns = tuple((c.name, c.type) for c in table.columns)
    schema = table.avro_schema or ""

    decode_one = F.udf(lambda value: read_avro(value, schema, columns), f"row {_struct(list(columns))}, error STRING")
    decoded = raw.withColumn("_avro", decode_one(F.col("value")))
    return decoded.select(*raw.columns, F.col("_avro.row").alias("row"), F.lit(False).alias("is_delete"),
                          F.col("_avro.error").isNotNull().alias("is_bad"))


def _target(table: RootTable, envelope: bool) -> Target:
    """The table as the Python readers see it: its columns, key, and whether records are Debezium's envelope."""
    return Target(tuple((c.name, c.type) for c in table.columns), table.primary_key, envelope)


def _typed_target(table: RootTable) -> Target:
    """A ``debezium-json`` table as the schema-driven reader sees it."""
    return _target(table, envelope=True)


def confluent_target(table: RootTable) -> Target:
    return _target(table, CONFLUENT[table.format])


def _confluent(raw: DataFrame, table: RootTable, schemas: dict[int, str], registry_url: str) -> DataFrame:
    target = confluent_target(table)
    decode_one = F.udf(lambda key, value: read_record(key, value, target, schemas, registry_url),
                       f"row {_struct(list(target.columns))}, is_delete BOOLEAN, error STRING")
    decoded = raw.withColumn("_record", decode_one(F.col("key"), F.col("value")))
    return decoded.select(*raw.columns, F.col("_record.row").alias("row"),
                          F.coalesce(F.col("_record.is_delete"), F.lit(False)).alias("is_delete"),
                          F.col("_record.error").isNotNull().alias("is_bad"))


def check_sources(roots: Iterable[RootTable], registry_url: str) -> None:
    """Refuse, before anything starts, a root table whose records cannot fill its columns."""
    for table in roots:
        if table.format in CONFLUENT:
            check_confluent(table, registry_url)


def check_confluent(table: RootTable, registry_url: str) -> None:
    """Before a pipeline starts: the registry answers as one, and every schema already registered
    for the table's topic fills the declared columns (else a ``UsageError`` naming the column)."""
    try:
        registry = SchemaRegistry(registry_url)
        registry.check()
        schemas = registry.subject(f"{table.topic}-value")
    except RegistryError as exc:
        raise UsageError(f"table {table.name} (format {table.format}): {exc}") from exc
    except RegistryUnavailable as exc:
        raise UsageError(f"table {table.name} (format {table.format}): {exc}; start it, or fix "
                         "LOCKSTEP_SCHEMA_REGISTRY_URL") from exc
    for schema_id, schema in sorted(schemas.items()):
        try:
            columns_reader(schema, confluent_target(table))
        except (UnmappableType, ValueError) as exc:
            raise UsageError(f"table {table.name}: schema id {schema_id} of subject {table.topic}-value: {exc}") from exc


def check_avro_schema(table: RootTable) -> None:
    """Fail early, with the fix, if the Avro schema cannot fill the table's columns."""
    import fastavro

    try:
        schema = json.loads(table.avro_schema or "")
        fastavro.parse_schema(schema)
    except (ValueError, fastavro.schema.SchemaParseException) as exc:
        raise ValueError(f"table {table.name}: 'avro_schema' is not a valid Avro schema: {exc}") from exc
    fields = {f["name"] for f in schema.get("fields", [])} if isinstance(schema, dict) else set()
    missing = [c.name for c in table.columns if c.name not in fields]
    if missing:
        raise ValueError(f"table {table.name}: the Avro schema has no field(s) {', '.join(missing)}; "
                         "add them to the schema or drop them from the table's columns")


def reason(table: RootTable, key: bytes | None, value: bytes | None, schemas: Mapping[int, str] | None = None,
           registry_url: str = "") -> str:
    """Why a record was rejected (computed again in Python, only for rejected records)."""
    if table.format in CONFLUENT:
        _, _, error = read_record(key, value, confluent_target(table), schemas or {}, registry_url)
        return error or f"primary key column(s) {', '.join(table.primary_key)} missing or null"
    if table.format == "avro":
        return _avro_reason(table, value)
    if table.format == "debezium-json" and any(needs_schema(c.type) for c in table.columns):
        typed = connect_json.read_record(key, value, _typed_target(table))
        if typed is not None and typed[2] is not None:
            return typed[2]
    if value is None:
        if table.format == "debezium-json":
            return f"tombstone whose record key is not a JSON object with {', '.join(table.primary_key)}"
        return f"empty record value (a Kafka tombstone); a root table of format {table.format} needs a JSON object"
    try:
        record = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        return f"malformed JSON: {exc}"
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    if table.format == "debezium-json":
        record = record.get("payload") if isinstance(record.get("payload"), dict) else record
        op = record.get("op")
        if op not in DEBEZIUM_OPS:
            return f"unknown Debezium op {op!r} (expected one of {', '.join(DEBEZIUM_OPS)})"
        side = "before" if op == "d" else "after"
        image = record.get(side)
        if not isinstance(image, dict):
            return f"Debezium op {op!r} ({DEBEZIUM_OPS[op]}) needs a {side!r} object"
        return _row_reason(table, image, f"{side}.")
    return _row_reason(table, record, "")


def _row_reason(table: RootTable, record: dict[str, Any], where: str) -> str:
    for column in table.columns:
        v = record.get(column.name)
        if v is None:
            if column.name in table.primary_key:
                return f"primary key column {where}{column.name} is missing or null"
            continue
        kind = column.type.upper()
        if not fits(kind, v):
            return f"column {where}{column.name}: expected {kind}, got {type(v).__name__} {json.dumps(v)[:40]}"
    return "record does not fit the table schema"


def _avro_reason(table: RootTable, value: bytes | None) -> str:
    _, error = read_avro(value, table.avro_schema or "", tuple((c.name, c.type) for c in table.columns))
    if error is None:
        return f"primary key column(s) {', '.join(table.primary_key)} missing or null"
    return error
