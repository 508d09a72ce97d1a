"""Which barriers a job commits and what each covers: offset ranges of root jobs, source
versions of intermediate jobs, and folding at the catch-up stride."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import astuple

from coordinator.domain import (
    BarrierAnnounced,
    BarrierCompleted,
    CutEntry,
    DeclareTable,
    MetaState,
    OffsetRange,
    RegisterJob,
    RequestRevision,
    fold,
)
from coordinator.domain.events import NO_PARTITIONS
from coordinator.domain.pruning import prunable
from coordinator.domain.work import EARLIEST, EMPTY, ready_barrier, work_for


def barriers(n: int, per_barrier: int = 5) -> list[BarrierAnnounced]:
    return [BarrierAnnounced(b, 1000 * b, (CutEntry("shopping_source", 0, b * per_barrier),)) for b in range(1, n + 1)]


def test_a_new_root_job_reads_from_earliest_then_barrier_by_barrier(make_state: Callable[..., MetaState]) -> None:
    state = make_state(*barriers(4), shopping_topology=True)
    job = state.jobs["ingest_shopping"]
    work = work_for(state, job, job.resume_barrier, ready_barrier(state, job))
    assert [(w.barrier, w.offsets) for w in work] == [
        (1, [OffsetRange("shopping_source", 0, EARLIEST, 5)]),
        (2, [OffsetRange("shopping_source", 0, 5, 10)]),
        (3, [OffsetRange("shopping_source", 0, 10, 15)]),
        (4, [OffsetRange("shopping_source", 0, 15, 20)]),
    ]


def test_a_lagging_root_job_folds_to_multiples_of_the_stride_without_gaps(make_state: Callable[..., MetaState]) -> None:
    state = make_state(*barriers(33), shopping_topology=True)
    job = state.jobs["ingest_shopping"]
    work = work_for(state, job, 2, 33, stride=10)
    assert [w.barrier for w in work] == [10, 20, 30, 31, 32, 33]
    ranges = [(start, end) for w in work for (_, _, start, end) in map(astuple, w.offsets)]
    assert ranges[0] == (10, 50)  # from the cut of barrier 2, where the job stopped
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # contiguous: nothing skipped twice


def test_a_root_job_continues_from_the_last_cut_that_has_its_topic(make_state: Callable[..., MetaState]) -> None:
    # barriers 3 and 4 were cut while no job read the topic (older coordinators cut only running jobs' topics)
    cutless = [BarrierAnnounced(b, 1000 * b) for b in (3, 4)]
    done = [BarrierCompleted("ingest_shopping", "shopping", b, 0, b) for b in (1, 2, 3, 4)]
    state = make_state(*barriers(2), *cutless, BarrierAnnounced(5, 5000, (CutEntry("shopping_source", 0, 25),)), *done,
                       shopping_topology=True)
    (work,) = work_for(state, state.jobs["ingest_shopping"], 4, 5)
    assert work.offsets == [OffsetRange("shopping_source", 0, 10, 25)]  # not from the earliest offset again


def test_a_root_job_skips_a_barrier_cut_before_its_topics_were_measured(make_state: Callable[..., MetaState]) -> None:
    # Two tables of one source's transactions: the orders job registered while barrier 2's cut was
    # taken, so the cut has the transaction topic (the lines job reads it too) but not its own
    # topic. Committing barrier 2 empty would hold fewer transactions than lines does there.
    both = ("orders_topic", "tx_topic")
    cuts = [BarrierAnnounced(1, 1000, (CutEntry("lines_topic", 0, 4), CutEntry("tx_topic", 0, 2))),
            BarrierAnnounced(2, 2000, (CutEntry("lines_topic", 0, 6), CutEntry("tx_topic", 0, 3))),
            BarrierAnnounced(3, 3000, (CutEntry("lines_topic", 0, 8), CutEntry("orders_topic", 0, 5),
                                       CutEntry("tx_topic", 0, 4)))]
    state = make_state(DeclareTable("d", "orders", "root"), *cuts[:1],
                       RegisterJob("r", "ingest_orders", "orders", external_topics=both), *cuts[1:])
    job = state.jobs["ingest_orders"]
    assert job.resume_barrier == 1
    work = work_for(state, job, job.resume_barrier, ready_barrier(state, job))
    assert [(w.barrier, w.offsets) for w in work] == [
        (3, [OffsetRange("orders_topic", 0, EARLIEST, 5), OffsetRange("tx_topic", 0, EARLIEST, 4)])]


def test_a_topic_measured_before_it_existed_holds_nothing_and_the_barrier_is_committed(
    make_state: Callable[..., MetaState],
) -> None:
    missing = BarrierAnnounced(1, 1000, (CutEntry("shopping_source", NO_PARTITIONS, 0),))
    created = BarrierAnnounced(2, 2000, (CutEntry("shopping_source", 0, 7), CutEntry("shopping_source", 1, 3)))
    state = make_state(missing, created, shopping_topology=True)
    job = state.jobs["ingest_shopping"]
    work = work_for(state, job, job.resume_barrier, ready_barrier(state, job))
    assert [(w.barrier, w.offsets) for w in work] == [
        (1, []), (2, [OffsetRange("shopping_source", 0, EARLIEST, 7), OffsetRange("shopping_source", 1, EARLIEST, 3)])]


def test_intermediate_jobs_take_only_exact_points_of_all_sources(make_state: Callable[..., MetaState]) -> None:
    done = [BarrierCompleted("ingest_shopping", "shopping", b, 0, 10 + b) for b in (1, 2, 4)]
    state = make_state(*barriers(5), *done, shopping_topology=True)
    job = state.jobs["amount_job"]
    assert ready_barrier(state, job) == 4
    work = work_for(state, job, 0, 4)
    assert [(w.barrier, w.source_versions) for w in work] == [(1, {"shopping": 11}), (2, {"shopping": 12}), (4, {"shopping": 14})]


def test_a_revised_root_job_restores_then_re_reads_from_the_revision_barriers_cut(
    make_state: Callable[..., MetaState],
) -> None:
    done = [BarrierCompleted("ingest_shopping", "shopping", b, 0, 10 + b) for b in (1, 2, 3, 4)]
    done += [BarrierCompleted(j, t, 2, 0, 5) for j, t in (("amount_job", "user_item_amount"), ("price_job", "user_item_price"))]
    state = make_state(*barriers(5), *done, RequestRevision("r", "shopping", 2), shopping_topology=True)
    job = state.jobs["ingest_shopping"]
    assert (job.generation, job.resume_barrier, state.latest_exact("shopping")) == (1, 2, 2)
    work = work_for(state, job, job.resume_barrier, ready_barrier(state, job))
    assert [(w.barrier, w.generation, w.restore_to) for w in work] == [(3, 1, (2, 12)), (4, 1, None), (5, 1, None)]
    assert work[0].offsets == [OffsetRange("shopping_source", 0, 10, 15)]  # the records after barrier 2, once more
    assert work_for(state, job, 3, 5)[0].restore_to is None  # restored once, at the start of the generation


def test_a_full_revision_empties_the_root_table_and_reads_from_the_earliest_offset(
    make_state: Callable[..., MetaState],
) -> None:
    done = [BarrierCompleted("ingest_shopping", "shopping", b, 0, 10 + b) for b in (1, 2)]
    state = make_state(*barriers(3), *done, RequestRevision("r", "shopping", 0, full=True), shopping_topology=True)
    job = state.jobs["ingest_shopping"]
    first = work_for(state, job, job.resume_barrier, 3)[0]
    assert (first.barrier, first.restore_to, first.offsets) == (1, (0, EMPTY), [OffsetRange("shopping_source", 0, EARLIEST, 5)])
    derived = work_for(state, state.jobs["amount_job"], 0, 3)
    assert derived == []  # the root's old exact points no longer count: it waits for the new generation


def test_a_barrier_pruned_while_in_flight_does_not_move_where_the_root_job_reads_next(
    make_state: Callable[..., MetaState],
) -> None:
    # The job lagged past the retention floor: barrier 3 was planned (it reads [10, 15)), then
    # pruned before its completion came; once folded, that completion is the newest exact point
    # and barrier 2 goes too. The next range must start where barrier 3's ended, not at the
    # first record again (the cut of a barrier that is left, or none at all).
    done = [BarrierCompleted("ingest_shopping", "shopping", b, 0, 10 + b) for b in (1, 2)]
    state = make_state(*barriers(20), *done, shopping_topology=True)
    job = state.jobs["ingest_shopping"]
    [in_flight] = work_for(state, job, 2, 3)
    assert in_flight.offsets == [OffsetRange("shopping_source", 0, 10, 15)]
    for tombstone in prunable(state, retain_barriers=5):
        state = fold(state, tombstone)
    assert 3 not in state.barriers and 2 in state.barriers  # kept: the newest exact point so far
    state = fold(state, BarrierCompleted("ingest_shopping", "shopping", 3, 0, 13, source_offsets=tuple(in_flight.offsets)))
    for tombstone in prunable(state, retain_barriers=5):
        state = fold(state, tombstone)
    assert 2 not in state.barriers and state.latest_exact("shopping") == 3
    work = work_for(state, job, 3, ready_barrier(state, job))
    ranges = [(r.start, r.end) for w in work for r in w.offsets]
    assert [w.barrier for w in work] == [20] and ranges == [(15, 100)]  # from where barrier 3 ended
