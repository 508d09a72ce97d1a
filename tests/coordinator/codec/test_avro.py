"""The single-object codec: round-trips every event, evolves, and never crashes on bad bytes."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.codec import SCHEMA_DIR, DecodeError, EventCodec, default_codec
from coordinator.codec.avro import schema_fingerprint
from coordinator.domain.events import EVENT_TYPES, BarrierAnnounced, TableState
from tests.support.strategies import any_event

codec = default_codec()


@settings(max_examples=60)
@given(st.one_of(*(any_event(cls) for cls in EVENT_TYPES)))
def test_every_event_round_trips(event: Any) -> None:
    data = codec.encode(event)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == codec.current[type(event).__name__].fingerprint
    assert codec.decode(data) == event


@settings(max_examples=500)
@given(st.binary(max_size=80), st.sampled_from(sorted(codec.writers)))
def test_random_bytes_never_crash_decoding(body: bytes, fingerprint: bytes) -> None:
    for data in (body, b"\xc3\x01" + fingerprint + body):
        try:
            codec.decode(data)
        except DecodeError:
            pass


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "missing C3 01 header"),
        (b"{}", "missing C3 01 header"),
        (b"\xc3\x01" + b"\x00" * 8 + b"x", "unknown schema fingerprint 0000000000000000"),
    ],
)
def test_bad_input_says_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        codec.decode(data)


def test_truncated_and_padded_records_are_rejected() -> None:
    data = codec.encode(TableState("shopping", "root", ("user_id",)))
    with pytest.raises(DecodeError, match="corrupt TableState"):
        codec.decode(data[:-3])
    with pytest.raises(DecodeError, match="trailing bytes"):
        codec.decode(data + b"\x00")


def test_a_record_from_an_older_writer_decodes_with_new_defaults(tmp_path: Path) -> None:
    """Simulate an evolution: an old BarrierAnnounced without ``cut``, kept in schemas/history/."""
    schemas = tmp_path / "schemas"
    shutil.copytree(SCHEMA_DIR, schemas)
    new = json.loads((schemas / "BarrierAnnounced.avsc").read_text())
    old = parse_schema({**new, "fields": [f for f in new["fields"] if f["name"] != "cut"]})
    (schemas / "history" / "BarrierAnnounced.v1.avsc").write_text(json.dumps(old))
    body = io.BytesIO()
    schemaless_writer(body, old, {"barrier": 7, "ts_ms": 1000})
    data = b"\xc3\x01" + schema_fingerprint(old) + body.getvalue()

    assert EventCodec(schemas).decode(data) == BarrierAnnounced(7, 1000, ())
    with pytest.raises(DecodeError, match="unknown schema fingerprint"):
        codec.decode(data)  # without the history file the writer is unknown: skipped, not guessed
