"""fold(state, fact) -> state: the one way state changes, shared by every reader.

Compaction-safe: each fact carries the whole state of its entity, so the latest value per
key is enough; a Tombstone deletes. Deterministic and free of I/O; for speed it updates
``state`` in place and returns it (``state.copy()`` first to keep the old one).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
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
    if state.tables.get(fact.name) != fact:
        state.changes.reshaped()
    state.tables[fact.name] = fact
    return state


@_fold.register
def _(fact: JobState, state: MetaState) -> MetaState:
    known = state.jobs.get(fact.job_id)
    if known is not None and replace(known, updated_at_ms=fact.updated_at_ms) == fact:
        state.changes.logged(("renewed", fact.job_id))  # a renewal: only when it was last heard of
    elif known != fact:
        state.changes.reshaped()
    state.jobs[fact.job_id] = fact
    return state


@_fold.register
def _(fact: BarrierAnnounced, state: MetaState) -> MetaState:
    if state.barriers.get(fact.barrier) != fact:
        state.changes.logged(("announced", fact.barrier))
    state.barriers[fact.barrier] = fact
    return state


@_fold.register
def _(fact: BarrierCompleted, state: MetaState) -> MetaState:
    by_barrier = state.completions.setdefault(fact.table, {})
    by_barrier[fact.barrier] = fact
    state.changes.logged(("completed", fact.table, fact.barrier))
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
    if kind != "lease":
        state.changes.reshaped()
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
