"""Avro single-object encoding: ``C3 01`` + 8-byte CRC-64-AVRO fingerprint + Avro body.

The fingerprint tells a reader which schema wrote a record, so no schema registry is
needed. Schemas are parsed once from ``schemas/`` (current) and ``schemas/history/``
(older writers, still decodable); a record is always decoded into the current dataclass.

Example::

    >>> from coordinator.domain.events import CutEntry, BarrierAnnounced
    >>> codec = default_codec()
    >>> data = codec.encode(BarrierAnnounced(7, 1000, (CutEntry("shopping", 0, 42),)))
    >>> data[:2].hex()
    'c301'
    >>> codec.decode(data)
    BarrierAnnounced(barrier=7, ts_ms=1000, cut=(CutEntry(topic='shopping', partition=0, offset=42),), strides=())
"""

from __future__ import annotations

import functools
import io
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

from coordinator.domain.errors import LockstepError
from coordinator.domain.events import EVENT_TYPES
from coordinator.domain.records import from_record, to_record

MAGIC = b"\xc3\x01"
HEADER_SIZE = len(MAGIC) + 8
SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"  # LOCKSTEP_SCHEMAS (Settings.schemas) overrides it


class DecodeError(LockstepError, ValueError):
    """Bytes that are not a Lockstep event; the message says what was wrong."""


@dataclass(frozen=True)
class WriterSchema:
    name: str
    parsed: Any
    fingerprint: bytes


def schema_fingerprint(parsed: Any) -> bytes:
    """CRC-64-AVRO of the parsing canonical form, little-endian as single-object encoding wants."""
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


class EventCodec:
    """Encodes events with their current schema; decodes any known writer schema."""

    def __init__(self, schema_dir: Path = SCHEMA_DIR) -> None:
        self.types = {cls.__name__: cls for cls in EVENT_TYPES}
        self.current: dict[str, WriterSchema] = {}
        self.writers: dict[bytes, WriterSchema] = {}
        for path in sorted(schema_dir.glob("*.avsc")):
            schema = self._load(path)
            if schema.name not in self.types:
                raise ValueError(f"{path} describes {schema.name!r}, which is no Lockstep event type")
            self.current[schema.name] = schema
        for path in sorted((schema_dir / "history").glob("*.avsc")):
            self._load(path)
        missing = sorted(set(self.types) - set(self.current))
        if missing:
            raise ValueError(f"no schema in {schema_dir} for {', '.join(missing)}")

    def _load(self, path: Path) -> WriterSchema:
        parsed = typing.cast(dict[str, Any], parse_schema(json.loads(path.read_text())))
        name = parsed["name"].rpartition(".")[2]
        schema = WriterSchema(name, parsed, schema_fingerprint(parsed))
        self.writers[schema.fingerprint] = schema
        return schema

    def encode(self, event: Any) -> bytes:
        schema = self.current[type(event).__name__]
        out = io.BytesIO()
        out.write(MAGIC)
        out.write(schema.fingerprint)
        schemaless_writer(out, schema.parsed, to_record(event))
        return out.getvalue()

    def decode(self, data: bytes) -> Any:
        """Bytes -> event; raises DecodeError (never anything else) on bad input."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise DecodeError(f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) < HEADER_SIZE or data[:2] != MAGIC:
            raise DecodeError("not Avro single-object encoded (missing C3 01 header)")
        writer = self.writers.get(data[2:HEADER_SIZE])
        if writer is None:
            raise DecodeError(f"unknown schema fingerprint {data[2:HEADER_SIZE].hex()}")
        body = io.BytesIO(data[HEADER_SIZE:])
        try:
            reader = self.current[writer.name]
            # Same schema: skip fastavro's (slow) schema resolution.
            record = schemaless_reader(body, writer.parsed, None if reader is writer else reader.parsed)
            if body.tell() != len(data) - HEADER_SIZE:
                raise DecodeError(f"{len(data) - HEADER_SIZE - body.tell()} trailing bytes after the record")
            return from_record(self.types[writer.name], typing.cast(dict[str, Any], record))
        except DecodeError:
            raise
        except Exception as exc:  # fastavro raises many types on corrupt bodies
            raise DecodeError(f"corrupt {writer.name} body: {type(exc).__name__}: {exc}") from exc


@functools.cache
def default_codec(schema_dir: Path | None = None) -> EventCodec:
    """The process-wide codec over ``schema_dir`` (default: ``schemas/`` of this checkout), parsed once."""
    return EventCodec(schema_dir or SCHEMA_DIR)
