"""The ``make_state`` fixture: a MetaState built by the real decide and fold, for pure-logic tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coordinator.domain import (
    BarrierAnnounced,
    BarrierCompleted,
    Command,
    DeclareTable,
    MetaState,
    RegisterJob,
    decide,
    fold,
)


@pytest.fixture
def make_state() -> Callable[..., MetaState]:
    """Factory: apply accepted commands and facts in order; a rejected command fails the test.

    ``make_state(shopping_topology=True)`` starts from FLIP-276's example topology:
    shopping (root, from topic shopping_source) -> user_item_amount, user_item_price.
    """

    def make(*items: Command | object, shopping_topology: bool = False, now_ms: int = 1_000) -> MetaState:
        state = MetaState()
        prelude: list[object] = []
        if shopping_topology:
            prelude = [
                DeclareTable("r1", "shopping", "root", ("user_id", "item_id")),
                DeclareTable("r2", "user_item_amount", "intermediate"),
                DeclareTable("r3", "user_item_price", "intermediate"),
                RegisterJob("r4", "ingest_shopping", "shopping", external_topics=("shopping_source",)),
                RegisterJob("r5", "amount_job", "user_item_amount", sources=("shopping",)),
                RegisterJob("r6", "price_job", "user_item_price", sources=("shopping",)),
            ]
        for item in [*prelude, *items]:
            if isinstance(item, BarrierAnnounced | BarrierCompleted) or not hasattr(item, "request_id"):
                state = fold(state, item)  # type: ignore[arg-type]
                continue
            decision = decide(state, item, now_ms)  # type: ignore[arg-type]
            assert decision.outcome.accepted, decision.outcome.reason
            for fact in decision.facts:
                state = fold(state, fact)
        return state

    return make
