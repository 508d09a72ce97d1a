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
from collections.abc import Callable
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
    return typing.cast(T, _builder(typing.cast(type, cls))(record))


Converter = Callable[[Any], Any]


@functools.cache
def _builder(cls: type) -> Callable[[dict[str, Any]], Any]:
    """Compile, once per class, the conversion of its fields (this runs for every event replayed)."""
    hints = typing.get_type_hints(cls)
    plain = [f.name for f in dataclasses.fields(cls) if _converter(hints[f.name]) is None]
    nested = [(f.name, c) for f in dataclasses.fields(cls) if (c := _converter(hints[f.name])) is not None]

    def build(record: dict[str, Any]) -> Any:
        kwargs = {name: record[name] for name in plain if name in record}
        for name, convert in nested:
            if name in record:
                value = record[name]
                kwargs[name] = None if value is None else convert(value)
        return cls(**kwargs)

    return build


def _converter(hint: Any) -> Converter | None:
    """How to turn a record value into the field's type; None where it is used as is."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _converter(inner[0])
    if origin is tuple:
        item = _converter(typing.get_args(hint)[0])
        if item is None:
            return tuple
        return lambda values: tuple(item(v) for v in values)
    if dataclasses.is_dataclass(hint):
        return _builder(typing.cast(type, hint))
    return None
