"""Events <-> plain records (dicts of str/int/bool/None/lists): the shape Avro and JSON share.

One generic mapping driven by the dataclass fields, so adding a field to an event needs no
code here.

Example::

    >>> from coordinator.domain.events import CutEntry
    >>> to_record(CutEntry("shopping", 0, 42))
    {'topic': 'shopping', 'partition': 0, 'offset': 42}
    >>> from_record(CutEntry, {'topic': 'shopping', 'partition': 0, 'offset': 42})
    CutEntry(topic='shopping', partition=0, offset=42)
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def to_record(event: Any) -> Any:
    """Dataclass -> dict, tuple -> list, recursively; scalars unchanged."""
    if dataclasses.is_dataclass(event) and not isinstance(event, type):
        return {f.name: to_record(getattr(event, f.name)) for f in dataclasses.fields(event)}
    if isinstance(event, tuple | list):
        return [to_record(item) for item in event]
    return event


def from_record(cls: type[T], record: dict[str, Any]) -> T:
    """dict -> dataclass ``cls``; missing fields take the dataclass default."""
    hints = _hints(cls)
    kwargs = {
        f.name: _convert(hints[f.name], record[f.name])
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.name in record
    }
    return cls(**kwargs)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(inner[0], value)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return tuple(_convert(item, v) for v in value)
    if dataclasses.is_dataclass(hint):
        return from_record(hint, value)  # type: ignore[arg-type]
    return value
