"""/metrics' figures from folded facts (pure: a state and the observer, no worker)."""

from __future__ import annotations

from coordinator.domain import BarrierAnnounced, BarrierCompleted, JobState, TableState, fold
from coordinator.domain.state import MetaState
from coordinator.stream.metrics import FoldMetrics, exposition
from tests.support import metric_samples


def samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return metric_samples(body.decode())


def test_a_completion_counts_once_and_a_revisions_recomputed_barriers_count_again() -> None:
    state, metrics = MetaState(), FoldMetrics()
    facts: list[object] = [TableState("t", "root"), JobState("j", "t", external_topics=("x",)),
                           BarrierAnnounced(1, 1_000), BarrierAnnounced(2, 2_000)]
    done = BarrierCompleted("j", "t", 2, 0, 5, rows_in=10, rows_out=9, rows_rejected=1, started_at_ms=2_100,
                            committed_at_ms=2_600)
    for fact in [*facts, done, done, BarrierCompleted("j", "t", 1, 0, 4, rows_in=3, rows_out=3)]:
        state = fold(state, fact)  # type: ignore[arg-type]
        metrics.observe(state, fact)
    revised = BarrierCompleted("j", "t", 1, 1, 6, rows_in=3, rows_out=3, committed_at_ms=2_900)  # generation 1
    state = fold(state, revised)
    metrics.observe(state, revised)
    got = samples(exposition(metrics, state, {"barriers_announced": 2}, now_ms=5_000, liveness_ms=30_000))
    assert got[("lockstep_rows_in_total", (("table", "t"),))] == 13  # the repeat and the older barrier did not count
    assert got[("lockstep_rows_rejected_total", (("table", "t"),))] == 1
    assert got[("lockstep_e2e_delay_seconds_count", (("table", "t"),))] == 2
    assert got[("lockstep_e2e_delay_seconds_sum", (("table", "t"),))] == 0.6 + 1.9
    assert got[("lockstep_job_barrier_seconds_sum", (("job", "j"),))] == 0.5
    assert got[("lockstep_barriers_announced_total", ())] == 2
    assert got[("lockstep_last_barrier", ())] == 2
    assert got[("lockstep_job_stalled", (("job", "j"),))] == 0


def test_freshness_is_now_minus_the_newest_exact_barriers_time_so_a_stall_shows() -> None:
    state = MetaState()
    for fact in (TableState("t", "root"), BarrierAnnounced(1, 1_000), BarrierAnnounced(2, 2_000),
                 BarrierCompleted("j", "t", 1, 0, 1, committed_at_ms=1_500)):
        state = fold(state, fact)  # type: ignore[arg-type]
    early = samples(exposition(FoldMetrics(), state, {}, now_ms=3_000, liveness_ms=30_000))
    late = samples(exposition(FoldMetrics(), state, {}, now_ms=63_000, liveness_ms=30_000))
    assert early[("lockstep_table_freshness_seconds", (("table", "t"),))] == 2.0
    assert late[("lockstep_table_freshness_seconds", (("table", "t"),))] == 62.0
    assert late[("lockstep_barrier_lag", (("table", "t"),))] == 1
