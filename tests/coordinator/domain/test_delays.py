"""Delay figures from completions: E2E per table, own delay per job, and the bottleneck."""

from __future__ import annotations

from collections.abc import Callable

from coordinator.domain import BarrierAnnounced, BarrierCompleted, DeregisterJob, MetaState, PhaseTime
from coordinator.domain.delays import delay_report


def test_own_delays_find_the_bottleneck_on_the_slowest_path(make_state: Callable[..., MetaState]) -> None:
    facts: list[object] = []
    for b in range(1, 11):
        ts = b * 1000
        facts += [
            BarrierAnnounced(b, ts),
            BarrierCompleted("ingest_shopping", "shopping", b, 0, b, committed_at_ms=ts + 200),
            BarrierCompleted("amount_job", "user_item_amount", b, 0, b, committed_at_ms=ts + 200 + 300),
            BarrierCompleted("price_job", "user_item_price", b, 0, b, committed_at_ms=ts + 200 + 100 * b),
        ]
    report = delay_report(make_state(*facts, shopping_topology=True), last=5)
    assert report["tables"]["shopping"]["e2e_p50_ms"] == 200
    assert report["tables"]["user_item_amount"]["e2e_p99_ms"] == 500
    assert report["tables"]["user_item_price"]["e2e_p50_ms"] == 1000  # barriers 6..10: 800..1200
    assert report["jobs"]["price_job"]["own_p99_ms"] == 1000
    assert report["jobs"]["amount_job"]["own_p50_ms"] == 300
    assert report["bottleneck"] == "price_job"
    assert report["tables"]["user_item_price"]["lag_barriers"] == 0
    # Readers of shopping see barrier b from ts + 200 until b + 1 commits 1 s later: 0.2 .. 1.2 s.
    # Sampled evenly over the window, so the p50 is mid-way and the p99 just before a commit.
    assert 690 <= report["tables"]["shopping"]["staleness_p50_ms"] <= 710
    assert 1170 <= report["tables"]["shopping"]["staleness_p99_ms"] <= 1200


def test_phases_of_a_job_are_reported_per_barrier(make_state: Callable[..., MetaState]) -> None:
    facts = [BarrierAnnounced(1, 1000), BarrierAnnounced(2, 2000)] + [
        BarrierCompleted("ingest_shopping", "shopping", b, 0, b, committed_at_ms=b * 1000 + 500,
                         phases=(PhaseTime("plan", 10 * b), PhaseTime("write", 300))) for b in (1, 2)]
    report = delay_report(make_state(*facts, shopping_topology=True))
    assert report["jobs"]["ingest_shopping"]["phases_p50_ms"] == {"plan": 10, "write": 300}
    assert report["jobs"]["amount_job"]["phases_p50_ms"] == {}


def test_a_stopped_job_stays_listed_with_its_status_and_is_never_the_bottleneck(
    make_state: Callable[..., MetaState],
) -> None:
    facts: list[object] = []
    for b in range(1, 4):
        facts += [
            BarrierAnnounced(b, b * 1000),
            BarrierCompleted("ingest_shopping", "shopping", b, 0, b, committed_at_ms=b * 1000 + 100),
            BarrierCompleted("amount_job", "user_item_amount", b, 0, b, committed_at_ms=b * 1000 + 400),
            BarrierCompleted("price_job", "user_item_price", b, 0, b, committed_at_ms=b * 1000 + 900),
        ]
    facts += [DeregisterJob("x", "price_job", "FINISHED"), BarrierAnnounced(4, 4000)]
    report = delay_report(make_state(*facts, shopping_topology=True))
    assert report["jobs"]["price_job"]["status"] == "FINISHED" and report["jobs"]["amount_job"]["status"] == "RUNNING"
    assert report["tables"]["user_item_price"]["writer"] is None
    assert report["tables"]["user_item_price"]["lag_barriers"] == 1
    assert report["bottleneck"] == "amount_job"  # price_job was slower, but it no longer runs


def test_no_completions_no_figures(make_state: Callable[..., MetaState]) -> None:
    report = delay_report(make_state(BarrierAnnounced(1, 1000), shopping_topology=True))
    assert report["bottleneck"] is None
    assert report["tables"]["shopping"] == {"latest_exact_barrier": None, "lag_barriers": 1, "e2e_p50_ms": None,
                                            "e2e_p99_ms": None, "e2e_last_ms": None, "staleness_p50_ms": None,
                                            "staleness_p99_ms": None, "writer": "ingest_shopping"}
