"""What vacuum keeps: leased versions, jobs' read positions (a stopped job's too, until its
table is dropped or written by another job), the exact points readers pick, and the retention
window; released leases hold nothing."""

from __future__ import annotations

from collections.abc import Callable

from coordinator.domain import (
    AcquireLease,
    BarrierAnnounced,
    BarrierCompleted,
    DeregisterJob,
    DropTable,
    MetaState,
    ReleaseLease,
    SourceVersion,
)
from coordinator.domain.retention import versions_to_keep

MakeState = Callable[..., MetaState]


def history(barriers: int) -> list[object]:
    """Barriers 1..n: shopping at version b, amount reads shopping b-1 at b (one behind), price at b."""
    facts: list[object] = []
    for b in range(1, barriers + 1):
        facts += [
            BarrierAnnounced(b, b * 1000),
            BarrierCompleted("ingest_shopping", "shopping", b, 0, 10 + b),
            BarrierCompleted("amount_job", "user_item_amount", b, 0, b,
                             source_versions=(SourceVersion("shopping", 10 + b - 1),)),
            BarrierCompleted("price_job", "user_item_price", b, 0, b, source_versions=(SourceVersion("shopping", 10 + b),)),
        ]
    return facts


def test_keeps_leases_job_positions_and_the_newest_points(make_state: MakeState) -> None:
    state = make_state(*history(8), AcquireLease("l", "rr-1", "me@host:1", ("shopping",), 3, secret="s"), shopping_topology=True)
    keeps = versions_to_keep(state, "shopping")
    assert [(k.version, k.reason.split(" ")[0]) for k in keeps] == [
        (13, "lease"), (17, "job"), (18, "its"), (18, "job"), (18, "read-committed")]
    assert "amount_job" in keeps[1].reason and "rr-1 of me@host:1" in keeps[0].reason


def test_a_released_lease_holds_nothing_and_a_stopped_job_what_it_reads_when_run_again(make_state: MakeState) -> None:
    state = make_state(*history(8), AcquireLease("l", "rr-1", "me", ("shopping",), 3, secret="s"), ReleaseLease("r", "rr-1", "s"),
                       DeregisterJob("d", "amount_job", "FINISHED"), shopping_topology=True)
    keeps = versions_to_keep(state, "shopping")
    assert {k.version for k in keeps} == {17, 18}
    assert "job amount_job reads the changes after it when run again (FINISHED)" in keeps[0].reason
    dropped = make_state(*history(8), DeregisterJob("d", "amount_job", "CANCELED"), DropTable("x", "user_item_amount"),
                         shopping_topology=True)
    assert {k.version for k in versions_to_keep(dropped, "shopping")} == {18}  # its table is gone: nothing to resume


def test_retain_barriers_keeps_the_exact_points_of_the_newest_barriers(make_state: MakeState) -> None:
    state = make_state(*history(8), BarrierAnnounced(9, 9000), BarrierAnnounced(10, 10_000), shopping_topology=True)
    assert min(k.version for k in versions_to_keep(state, "user_item_price", retain_barriers=5)) == 6  # barriers 6..10
    assert min(k.version for k in versions_to_keep(state, "user_item_price", retain_barriers=0)) == 8
    assert versions_to_keep(state, "nothing_yet") == []
