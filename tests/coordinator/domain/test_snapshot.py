"""Read levels resolve to one barrier and a version per table, or a clear error."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coordinator.domain import BarrierAnnounced, BarrierCompleted, MetaState
from coordinator.domain.errors import Rejected
from coordinator.domain.snapshot import Snapshot, resolve_snapshot


@pytest.fixture
def state(make_state: Callable[..., MetaState]) -> MetaState:
    return make_state(
        BarrierAnnounced(1, 1_000),
        BarrierAnnounced(2, 2_000),
        BarrierAnnounced(3, 3_000),
        *(BarrierCompleted("ingest_shopping", "shopping", b, 0, b * 10) for b in (1, 2, 3)),
        *(BarrierCompleted("amount_job", "user_item_amount", b, 0, b) for b in (1, 2)),
        shopping_topology=True,
    )


def test_read_committed_picks_the_newest_common_exact_point(state: MetaState) -> None:
    both = resolve_snapshot(state, ["shopping", "user_item_amount"])
    assert both == Snapshot(2, {"shopping": 20, "user_item_amount": 2}, 2_000)
    assert resolve_snapshot(state, ["shopping"], "repeatable-read") == Snapshot(3, {"shopping": 30}, 3_000)


def test_as_of_barrier_and_timestamp(state: MetaState) -> None:
    assert resolve_snapshot(state, ["shopping"], as_of_barrier=1) == Snapshot(1, {"shopping": 10}, 1_000)
    assert resolve_snapshot(state, ["shopping"], as_of_timestamp=2_500) == Snapshot(2, {"shopping": 20}, 2_000)


def test_read_uncommitted_leaves_versions_to_the_reader(state: MetaState) -> None:
    assert resolve_snapshot(state, ["user_item_price"], "read-uncommitted") == Snapshot(None, {"user_item_price": None})
    # its data is at least as fresh as the oldest of the tables' newest exact points
    both = resolve_snapshot(state, ["shopping", "user_item_amount"], "read-uncommitted")
    assert both == Snapshot(None, {"shopping": None, "user_item_amount": None}, 2_000)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tables": ["nope"]}, "unknown table(s): nope"),
        ({"tables": []}, "name at least one table"),
        ({"tables": ["shopping"], "level": "serializable"}, "unknown read level 'serializable'"),
        ({"tables": ["user_item_amount"], "as_of_barrier": 3}, "'user_item_amount' has no exact point at barrier 3"),
        ({"tables": ["shopping"], "as_of_timestamp": 5}, "no barrier was announced at or before timestamp 5"),
        ({"tables": ["user_item_price"]}, "no common exact point yet"),
        ({"tables": ["shopping"], "as_of_barrier": 1, "as_of_timestamp": 1}, "not both"),
    ],
)
def test_errors_say_what_is_wrong(state: MetaState, kwargs: dict, message: str) -> None:
    with pytest.raises(Rejected, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_snapshot(state, **kwargs)
