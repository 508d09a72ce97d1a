"""Every schema's fingerprint history is pinned, and every change is a compatible evolution.

Changing a schema on purpose: copy the old file to ``schemas/history/<Name>.v<N>.avsc``, add
fields *with defaults* only, then append the new fingerprint below. This test then checks
that the current schema can read every historical writer.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from fastavro import parse_schema

from coordinator.codec import SCHEMA_DIR, EventCodec
from coordinator.codec.avro import schema_fingerprint
from coordinator.domain.events import EVENT_TYPES

FINGERPRINT_HISTORY: dict[str, list[str]] = {
    "AbandonTable": ["2a30500a09193d83"],
    "AcquireLease": ["eb2e51863e2b18b7", "2e89e642dbeadf89"],
    "BarrierAnnounced": ["c7df0fb0e77eb945", "390e814b3ce22485"],
    "BarrierCompleted": ["6aa223855f8bf9c5", "c2f5d6dad2649e01", "19b27cfc453f540c"],
    "CommandOutcome": ["22c00cfc68220b86"],
    "DeclareTable": ["af759312e48266a8", "677a03fa335dec4c", "4c2e9cadfbf8b893"],
    "DeregisterJob": ["a1813e8723fd8b7c"],
    "DropTable": ["a9bcea6c14709039"],
    "JobState": ["de03a1191a68fff0"],
    "LeaseState": ["c53a8fc6255c4253", "a858c4d9c38fc1ff"],
    "RegisterJob": ["d68aca1f014d7178"],
    "ReleaseLease": ["4ba16faf21a75a71", "a761d96bde8d689c"],
    "RenewJob": ["9a23d68a14077950"],
    "RequestRevision": ["844b7f89978d3359"],
    "TableState": ["a64befcbeb40566b", "aef45aad7b0a9ab4", "134832030713aa74", "2a9f124a887f9129", "a7a9a88c35ae3925"],
}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_current_fingerprints_are_the_last_of_their_pinned_history() -> None:
    codec = EventCodec()
    current = {name: s.fingerprint.hex() for name, s in codec.current.items()}
    assert current == {name: history[-1] for name, history in FINGERPRINT_HISTORY.items()}, (
        "a schema changed: keep the old file in schemas/history/ and append the new fingerprint"
    )


def test_every_historical_writer_is_kept_and_known() -> None:
    kept = {schema_fingerprint(parse_schema(load(p))).hex() for p in (SCHEMA_DIR / "history").glob("*.avsc")}
    for name, history in FINGERPRINT_HISTORY.items():
        for old in history[:-1]:
            assert old in kept, f"{name} fingerprint {old} is pinned but its schema is not in schemas/history/"


def fields(schema: dict) -> dict[str, dict]:
    return {f["name"]: f for f in schema["fields"]}


def incompatibilities(old: dict, new: dict) -> list[str]:
    """Why records written with ``old`` could not be read with ``new`` (empty: compatible)."""
    problems = [f"field {name!r} removed" for name in fields(old) if name not in fields(new)]
    for name, field in fields(new).items():
        if name not in fields(old):
            if "default" not in field:
                problems.append(f"new field {name!r} has no default")
        elif field["type"] != fields(old)[name]["type"]:
            problems.append(f"field {name!r} changed type")
    return problems


def test_every_historical_schema_evolves_compatibly_into_the_current_one() -> None:
    for path in sorted((SCHEMA_DIR / "history").glob("*.avsc")):
        old = load(path)
        assert incompatibilities(old, load(SCHEMA_DIR / f"{old['name']}.avsc")) == [], path.name


def test_the_compatibility_check_catches_bad_changes() -> None:
    base = load(SCHEMA_DIR / "TableState.avsc")
    added = {**base, "fields": [*base["fields"], {"name": "owner", "type": "string", "default": ""}]}
    assert incompatibilities(base, added) == []
    no_default = {**base, "fields": [*base["fields"], {"name": "owner", "type": "string"}]}
    assert incompatibilities(base, no_default) == ["new field 'owner' has no default"]
    removed = {**base, "fields": base["fields"][1:]}
    assert incompatibilities(base, removed) == ["field 'name' removed"]
    retyped = {**base, "fields": [{**base["fields"][0], "type": "long"}, *base["fields"][1:]]}
    assert incompatibilities(base, retyped) == ["field 'name' changed type"]


def test_schemas_match_the_event_dataclasses() -> None:
    for cls in EVENT_TYPES:
        schema = load(SCHEMA_DIR / f"{cls.__name__}.avsc")
        assert [f["name"] for f in schema["fields"]] == [f.name for f in dataclasses.fields(cls)], cls.__name__
        for field in dataclasses.fields(cls):
            has_default = field.default is not dataclasses.MISSING
            assert has_default == ("default" in fields(schema)[field.name]), f"{cls.__name__}.{field.name}"
