"""REST bodies computed from a folded state (pure; the worker tests cover the HTTP side)."""

from __future__ import annotations

from collections.abc import Callable

from coordinator.domain import (
    AcquireLease,
    BarrierAnnounced,
    BarrierCompleted,
    DeclareTable,
    MetaState,
    RegisterJob,
    TableStride,
)
from coordinator.stream import views
from coordinator.stream.metrics import FoldMetrics, exposition
from tests.support import metric_samples


def test_table_delays_and_metrics(make_state: Callable[..., MetaState]) -> None:
    state = make_state(
        BarrierAnnounced(1, 1_000),
        BarrierAnnounced(2, 2_000),
        BarrierCompleted("ingest_shopping", "shopping", 1, 0, 4, committed_at_ms=1_700),
        shopping_topology=True,
    )
    table = views.table(state, "shopping")
    assert table is not None and table["exact_points"] == {"1": 4} and table["latest_exact_barrier"] == 1
    assert views.table(state, "nope") is None
    assert views.delays(state, 2_000, 30_000)["tables"]["shopping"] == {
        "latest_exact_barrier": 1, "lag_barriers": 1, "e2e_p50_ms": 700, "e2e_p99_ms": 700, "e2e_last_ms": 700,
        "staleness_p50_ms": None, "staleness_p99_ms": None, "writer": "ingest_shopping"}
    assert views.delays(state, 2_000, 30_000)["tables"]["user_item_price"]["lag_barriers"] == 2
    metrics = metric_samples(exposition(FoldMetrics(), state, {"decode_errors": 3}, 2_000, 30_000).decode())
    assert metrics[("lockstep_barrier_lag", (("table", "shopping"),))] == 1
    assert metrics[("lockstep_table_freshness_seconds", (("table", "shopping"),))] == 1.0  # barrier 1 at 1 s, now 2 s
    assert metrics[("lockstep_decode_errors_total", ())] == 3
    assert [b["barrier"] for b in views.barriers(state, 2, 10)] == [2]
    assert views.topology(state, 2_000, 30_000)["edges"] == [["shopping", "user_item_amount"], ["shopping", "user_item_price"]]


def test_a_job_shows_the_fused_group_that_made_its_newest_commit(make_state: Callable[..., MetaState]) -> None:
    state = make_state(BarrierAnnounced(1, 1_000), BarrierAnnounced(2, 2_000),
                       BarrierCompleted("ingest_shopping", "shopping", 1, 0, 4),
                       BarrierCompleted("amount_job", "user_item_amount", 1, 0, 1, fused_with="ingest_shopping"),
                       BarrierCompleted("price_job", "user_item_price", 1, 0, 1, fused_with="ingest_shopping"),
                       BarrierCompleted("price_job", "user_item_price", 2, 0, 2),  # left the group: its own query
                       shopping_topology=True)
    jobs = views.topology(state, 2_000, 30_000)["jobs"]
    assert {j: v["fused_with"] for j, v in jobs.items()} == {
        "ingest_shopping": "", "amount_job": "ingest_shopping", "price_job": ""}


def test_a_running_job_silent_past_the_liveness_window_shows_as_stalled(make_state: Callable[..., MetaState]) -> None:
    state = make_state(BarrierAnnounced(1, 1_000),
                       BarrierCompleted("ingest_shopping", "shopping", 1, 0, 4, committed_at_ms=50_000),
                       shopping_topology=True)  # the jobs registered at 1 s
    now, liveness = 60_000, 30_000
    jobs = views.topology(state, now, liveness)["jobs"]
    assert {j: v["status"] for j, v in jobs.items()} == {
        "ingest_shopping": "RUNNING", "amount_job": "STALLED", "price_job": "STALLED"}
    assert views.delays(state, now, liveness)["jobs"]["price_job"]["status"] == "STALLED"
    metrics = metric_samples(exposition(FoldMetrics(), state, {}, now, liveness).decode())
    assert metrics[("lockstep_job_stalled", (("job", "amount_job"),))] == 1
    assert metrics[("lockstep_job_stalled", (("job", "ingest_shopping"),))] == 0
    assert state.jobs["amount_job"].status == "RUNNING"  # derived for display, never stored


def test_the_pages_overview_has_freshness_dead_letters_timeline_leases_and_rejections(
    make_state: Callable[..., MetaState],
) -> None:
    state = make_state(
        BarrierAnnounced(1, 1_000),
        BarrierAnnounced(2, 2_000),
        BarrierCompleted("ingest_shopping", "shopping", 1, 0, 4, rows_rejected=2, committed_at_ms=1_300),
        BarrierCompleted("ingest_shopping", "shopping", 2, 0, 5, rows_rejected=1, committed_at_ms=2_450),
        BarrierCompleted("amount_job", "user_item_amount", 1, 0, 1, committed_at_ms=1_600),
        AcquireLease("r9", "lease-1", "reader", ("shopping",), 2, ttl_ms=10_000, secret="s"),
        shopping_topology=True,
    )
    rejected = [{"at_ms": 2_400, "command": "RegisterJob", "request_id": "r10", "reason": "unknown table 'x'"}]
    page = views.overview(state, 2_500, 30_000, rejected)
    shopping, amount = page["tables"]["shopping"], page["tables"]["user_item_amount"]
    assert (shopping["freshness_ms"], shopping["dead_letters"], shopping["lag_barriers"]) == (500, 3, 0)
    assert (amount["freshness_ms"], amount["dead_letters"], amount["lag_barriers"]) == (1_500, 0, 1)
    assert page["tables"]["user_item_price"]["freshness_ms"] is None  # nothing committed yet
    assert page["barriers"] == [{"barrier": 1, "ts_ms": 1_000, "committed": 2, "of": 3},
                                {"barrier": 2, "ts_ms": 2_000, "committed": 1, "of": 3}]
    assert page["jobs"]["ingest_shopping"]["status"] == "RUNNING" and page["edges"]
    assert [lease["lease_id"] for lease in page["leases"]] == ["lease-1"]
    assert page["rejections"] == rejected
    assert page["columns"] == {}  # the shopping topology of these tests has no queries
    assert shopping["e2e_p50_ms"] == 300  # barriers 1 (300 ms) and 2 (450 ms)
    assert views.overview(state, 2_500, 30_000, [], since_ms=1_500)["tables"]["shopping"]["e2e_p50_ms"] == 450


def test_a_strided_table_shows_its_stride_and_why_and_is_due_only_at_its_multiples(
    make_state: Callable[..., MetaState],
) -> None:
    every2 = (TableStride("user_item_price", 2, 4_500, 1_000),)
    state = make_state(BarrierAnnounced(1, 1_000), BarrierAnnounced(2, 2_000, strides=every2),
                       BarrierAnnounced(3, 3_000, strides=every2), shopping_topology=True)
    tables = views.topology(state, 3_000, 30_000)["tables"]
    assert tables["user_item_price"]["stride"] == {"every": 2, "cost_ms": 4_500, "reference_ms": 1_000}
    assert tables["shopping"]["stride"] is None
    assert [b["of"] for b in views.overview(state, 3_000, 30_000, [])["barriers"]] == [3, 3, 2]


def test_the_overview_traces_columns_from_the_root_tables_ddl_and_the_jobs_queries(
    make_state: Callable[..., MetaState],
) -> None:
    state = make_state(
        DeclareTable("r1", "orders", "root", schema="`user_id` BIGINT, `amount` BIGINT"),
        DeclareTable("r2", "spend", "intermediate", ctas=True),
        DeclareTable("r3", "top", "intermediate", ctas=True),
        RegisterJob("r4", "ingest_orders", "orders", external_topics=("orders",)),
        RegisterJob("r5", "maintain_spend", "spend", sources=("orders",),
                    sql="SELECT user_id, SUM(amount) AS total FROM orders GROUP BY user_id"),
        RegisterJob("r6", "maintain_top", "top", sources=("spend",), sql="SELECT MAX(total) AS best FROM spend"),
    )
    assert views.overview(state, 0, 30_000, [])["columns"] == {
        "spend": {"user_id": ["orders.user_id"], "total": ["orders.amount"]}, "top": {"best": ["spend.total"]}}
