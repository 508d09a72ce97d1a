"""The fold is order-independent across topics and compaction-safe (hypothesis properties)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain import BarrierCompleted, GenerationStart, MetaState, TableState, Tombstone, entity_key, fold, fold_all
from tests.support.strategies import state_topics


def interleave(topics: dict[str, list[Any]], choices: list[int]) -> list[Any]:
    """Merge the topics' records keeping each topic's own order, driven by ``choices``."""
    queues = {name: list(records) for name, records in topics.items()}
    merged: list[Any] = []
    for choice in choices:
        live = [name for name in sorted(queues) if queues[name]]
        if not live:
            break
        merged.append(queues[live[choice % len(live)]].pop(0))
    for name in sorted(queues):
        merged.extend(queues[name])
    return merged


def compact(records: list[Any]) -> list[Any]:
    """What Kafka's log compaction may leave of one topic: the last record per key, in order."""
    last = {entity_key(r): i for i, r in enumerate(records)}
    return [r for i, r in enumerate(records) if last[entity_key(r)] == i]


@settings(max_examples=300)
@given(state_topics, st.lists(st.integers(0, 3), max_size=60), st.lists(st.integers(0, 3), max_size=60))
def test_any_interleaving_of_state_topics_folds_to_the_same_state(
    topics: dict[str, list[Any]], first: list[int], second: list[int]
) -> None:
    a = fold_all(interleave(topics, first))
    b = fold_all(interleave(topics, second))
    assert a.canonical_json() == b.canonical_json()
    assert a.state_hash() == b.state_hash()


@settings(max_examples=300)
@given(state_topics, st.lists(st.integers(0, 3), max_size=60))
def test_latest_value_per_key_folds_to_the_same_state(topics: dict[str, list[Any]], choices: list[int]) -> None:
    full = fold_all(interleave(topics, choices))
    compacted = fold_all(interleave({name: compact(records) for name, records in topics.items()}, choices))
    assert compacted.canonical_json() == full.canonical_json()


def test_tombstone_deletes_the_entity_and_unknown_keys_are_harmless() -> None:
    state = fold_all(
        [
            TableState("a", "root"),
            BarrierCompleted("j", "a", 1, 0, 3),
            Tombstone("completion:a@1"),
            Tombstone("lease:never-existed"),
            Tombstone("nonsense"),
        ]
    )
    assert state.completions == {}
    assert list(state.tables) == ["a"]
    fold(state, Tombstone("table:a"))
    assert state.tables == {}


def test_canonical_dump_is_stable_and_hash_changes_with_content() -> None:
    a = fold_all([TableState("b", "root"), TableState("a", "root")])
    b = fold_all([TableState("a", "root"), TableState("b", "root")])
    assert a.canonical_json() == b.canonical_json()
    assert len(a.state_hash()) == 64
    fold(b, TableState("a", "root", generation=1, generations=(GenerationStart(0, 0), GenerationStart(1, 5))))
    assert a.state_hash() != b.state_hash()
    assert MetaState().state_hash() == MetaState().state_hash()
