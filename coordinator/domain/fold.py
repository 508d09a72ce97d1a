"""fold(state, fact) -> state: the one way state changes, shared by every reader.

Compaction-safe: each fact carries the whole state of its entity, so the latest value per
key is enough; a Tombstone deletes. Deterministic and free of I/O; for speed it updates
``state`` in place and returns it (``state.copy()`` first to keep the old one).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import singledispatch

from coordinator.domain.events import (
    BarrierAnnounced,
    BarrierCompleted,
    CommandOutcome,
    Fact,
    JobState,
    LeaseState,
    TableState,
    Tombstone,
    split_key,
)
from coordinator.domain.state import MetaState


def fold(state: MetaState, fact: Fact | Tombstone | CommandOutcome) -> MetaState:
    """Apply one fact (or tombstone) to ``state`` and return it."""
    return _fold(fact, state)


def fold_all(facts: Iterable[Fact | Tombstone | CommandOutcome], state: MetaState | None = None) -> MetaState:
    state = MetaState() if state is None else state
    for fact in facts:
        state = _fold(fact, state)
    return state


@singledispatch
def _fold(event: object, state: MetaState) -> MetaState:
    raise TypeError(f"cannot fold {type(event).__name__}: it is not a state fact")


@_fold.register
def _(fact: TableState, state: MetaState) -> MetaState:
    state.tables[fact.name] = fact
    return state


@_fold.register
def _(fact: JobState, state: MetaState) -> MetaState:
    state.jobs[fact.job_id] = fact
    return state


@_fold.register
def _(fact: BarrierAnnounced, state: MetaState) -> MetaState:
    state.barriers[fact.barrier] = fact
    return state


@_fold.register
def _(fact: BarrierCompleted, state: MetaState) -> MetaState:
    by_barrier = state.completions.setdefault(fact.table, {})
    by_barrier.pop(fact.barrier, None)  # the fact folded last is last in the dict: what TableMemo watches
    by_barrier[fact.barrier] = fact
    return state


@_fold.register
def _(fact: LeaseState, state: MetaState) -> MetaState:
    state.leases[fact.lease_id] = fact
    return state


@_fold.register
def _(fact: CommandOutcome, state: MetaState) -> MetaState:
    return state  # outcomes answer requests; they are not entity state


@_fold.register
def _(fact: Tombstone, state: MetaState) -> MetaState:
    kind, ident = split_key(fact.key)
    if kind == "table":
        state.tables.pop(ident, None)
    elif kind == "job":
        state.jobs.pop(ident, None)
    elif kind == "barrier" and ident.isdigit():
        state.barriers.pop(int(ident), None)
    elif kind == "completion":
        table, _, barrier = ident.rpartition("@")
        by_barrier = state.completions.get(table, {})
        if barrier.isdigit():
            by_barrier.pop(int(barrier), None)
        if not by_barrier:
            state.completions.pop(table, None)
    elif kind == "lease":
        state.leases.pop(ident, None)
    return state
