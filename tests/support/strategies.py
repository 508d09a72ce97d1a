"""Hypothesis strategies for Lockstep events, derived from the dataclasses' type hints."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from hypothesis import strategies as st

from coordinator.domain.events import (
    BarrierAnnounced,
    BarrierCompleted,
    GenerationStart,
    JobState,
    LeaseState,
    SourceVersion,
    TableState,
    Tombstone,
)

LONGS = st.integers(min_value=-(2**63), max_value=2**63 - 1)
SMALL = st.integers(min_value=0, max_value=6)
NAMES = st.sampled_from(["a", "b", "c", "d"])


def for_hint(hint: Any) -> st.SearchStrategy[Any]:
    """Any value of an event field's type (full Avro ranges: longs, unicode strings)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(for_hint(a) for a in typing.get_args(hint)))
    if origin is tuple:
        return st.lists(for_hint(typing.get_args(hint)[0]), max_size=3).map(tuple)
    if dataclasses.is_dataclass(hint):
        return any_event(hint)
    return {str: st.text(max_size=12), int: LONGS, bool: st.booleans(), type(None): st.none()}[hint]


def any_event(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: for_hint(hints[f.name]) for f in dataclasses.fields(cls)})


# -- realistic state-topic streams: few keys, so records collide and overwrite ------------------

generations = st.lists(st.builds(GenerationStart, SMALL, SMALL), min_size=1, max_size=3).map(tuple)
table_states = st.builds(TableState, name=NAMES, kind=st.sampled_from(["root", "intermediate"]),
                         writer=st.none() | NAMES, generation=SMALL, generations=generations)
job_states = st.builds(JobState, job_id=NAMES, sink=NAMES, sources=st.lists(NAMES, max_size=2).map(tuple),
                       status=st.sampled_from(["RUNNING", "FINISHED"]), generation=SMALL)
barriers = st.builds(BarrierAnnounced, barrier=SMALL, ts_ms=SMALL)
completions = st.builds(BarrierCompleted, job_id=NAMES, table=NAMES, barrier=SMALL, generation=SMALL,
                        delta_version=SMALL, committed_at_ms=SMALL)
leases = st.builds(LeaseState, lease_id=NAMES, holder=NAMES, barrier=SMALL,
                   versions=st.lists(st.builds(SourceVersion, NAMES, SMALL), max_size=2).map(tuple),
                   acquired_at_ms=SMALL, expires_at_ms=SMALL)


def tombstones(prefix: str, idents: st.SearchStrategy[Any]) -> st.SearchStrategy[Tombstone]:
    return idents.map(lambda i: Tombstone(f"{prefix}:{i}"))


TOPIC_STREAMS: dict[str, st.SearchStrategy[Any]] = {
    "registry": st.lists(table_states | job_states | tombstones("table", NAMES) | tombstones("job", NAMES), max_size=12),
    "barriers": st.lists(barriers | tombstones("barrier", SMALL), max_size=8),
    "completions": st.lists(
        completions | st.builds(lambda t, b: Tombstone(f"completion:{t}@{b}"), NAMES, SMALL), max_size=12
    ),
    "leases": st.lists(leases | tombstones("lease", NAMES), max_size=8),
}
state_topics = st.fixed_dictionaries(TOPIC_STREAMS)
