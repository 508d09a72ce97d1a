"""The schema registry client against the session's real registry."""

from __future__ import annotations

from typing import Any

import pytest

from spark_jobs.runtime import schema_registry
from spark_jobs.runtime.schema_registry import SchemaRegistry, UnknownSchema
from tests.support.cdc import CdcStack

pytestmark = [pytest.mark.integration]


def test_an_unknown_schema_id_costs_one_registry_call_not_one_per_record(
    cdc_stack: CdcStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = SchemaRegistry(cdc_stack.registry.url)
    asked: list[str] = []
    real_get = SchemaRegistry._get

    def counted(self: SchemaRegistry, path: str) -> Any:
        asked.append(path)
        return real_get(self, path)

    monkeypatch.setattr(SchemaRegistry, "_get", counted)
    for _ in range(50):  # fifty records with the same unknown id, as a batch of a topic would bring
        with pytest.raises(UnknownSchema, match="schema id 987654 is not in the schema registry"):
            registry.schema(987654)
    assert asked == ["/schemas/ids/987654"]
    monkeypatch.setattr(schema_registry, "UNKNOWN_TTL_S", 0.0)  # the answer is asked again once it is old
    schema_registry._UNKNOWN.clear()
    with pytest.raises(UnknownSchema):
        registry.schema(987654)
    assert len(asked) == 2
