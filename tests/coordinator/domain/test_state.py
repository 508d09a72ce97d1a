"""Views derived from MetaState: exact points across revisions, b*, timestamps, topology."""

from __future__ import annotations

from collections.abc import Callable

from coordinator.domain import (
    BarrierAnnounced,
    BarrierCompleted,
    DeregisterJob,
    GenerationStart,
    MetaState,
    RegisterJob,
    RequestRevision,
    TableState,
    WriterTerm,
    fold_all,
)

MakeState = Callable[..., MetaState]


WRITERS = {"shopping": "ingest_shopping", "user_item_amount": "amount_job", "user_item_price": "price_job"}


def completions(table: str, generation: int, versions: dict[int, int], job: str | None = None) -> list[BarrierCompleted]:
    """Completions by ``job`` (default: the job that writes ``table`` in the shopping topology)."""
    job = job or WRITERS.get(table, f"{table}_job")
    return [BarrierCompleted(job, table, b, generation, v) for b, v in versions.items()]


def test_completions_of_an_older_generation_after_the_revision_barrier_stop_counting() -> None:
    revised = TableState("t", "root", generation=1, generations=(GenerationStart(0, 0), GenerationStart(1, 2)))
    old = completions("t", 0, {1: 1, 2: 2, 3: 3, 4: 4})
    new = completions("t", 1, {3: 5})
    # Whatever the arrival order across topics, the derived exact points are the same.
    for facts in ([revised, *old, *new], [*old, *new, revised], [*old, revised, *new]):
        state = fold_all(facts)
        assert state.exact_points("t") == {1: 1, 2: 2, 3: 5}
        assert state.latest_exact("t") == 3


def test_second_revision_to_an_earlier_barrier_voids_both_older_generations() -> None:
    twice = TableState(
        "t", "root", generation=2,
        generations=(GenerationStart(0, 0), GenerationStart(1, 5), GenerationStart(2, 2)),
    )
    state = fold_all([twice, *completions("t", 0, {1: 1, 2: 2, 6: 6}), *completions("t", 1, {3: 7, 6: 8})])
    assert state.exact_points("t") == {1: 1, 2: 2}


def test_completion_of_a_future_generation_or_unknown_table_does_not_count() -> None:
    state = fold_all([TableState("t", "root"), *completions("t", 1, {1: 1}), *completions("ghost", 0, {1: 1})])
    assert state.exact_points("t") == {}
    assert state.exact_points("ghost") == {}


def test_common_barrier_is_the_newest_exact_point_of_all_tables(make_state: MakeState) -> None:
    state = make_state(
        *completions("shopping", 0, {1: 1, 2: 2, 3: 3}),
        *completions("user_item_amount", 0, {1: 1, 2: 1}),
        *completions("user_item_price", 0, {1: 1, 3: 2}),
        shopping_topology=True,
    )
    assert state.common_barrier(["shopping", "user_item_amount"]) == 2
    assert state.common_barrier(["user_item_amount", "user_item_price"]) == 1
    assert state.common_barrier(["shopping", "user_item_price"]) == 3
    assert state.common_barrier(["shopping", "nope"]) is None


def test_barrier_at_timestamp() -> None:
    state = fold_all([BarrierAnnounced(1, 1000), BarrierAnnounced(2, 2000), BarrierAnnounced(3, 3000)])
    assert state.barrier_at(999) is None
    assert state.barrier_at(2000) == 2
    assert state.barrier_at(2999) == 2
    assert state.last_barrier() == 3


def test_topology_views(make_state: MakeState) -> None:
    state = make_state(shopping_topology=True)
    assert state.edges() == [("shopping", "user_item_amount"), ("shopping", "user_item_price")]
    assert state.downstream("shopping") == ["shopping", "user_item_amount", "user_item_price"]
    assert state.downstream("user_item_price") == ["user_item_price"]
    assert state.external_topics() == ["shopping_source"]
    stopped = make_state(DeregisterJob("x", "ingest_shopping", "CANCELED"), shopping_topology=True)
    assert stopped.external_topics() == ["shopping_source"]  # barriers keep its cut for when it runs again
    assert state.writer_of("user_item_amount").job_id == "amount_job"
    assert state.path("shopping", "user_item_price") == ["shopping", "user_item_price"]
    assert state.path("user_item_price", "shopping") is None


def test_revision_then_republish_moves_exact_points_to_the_new_generation(make_state: MakeState) -> None:
    state = make_state(
        BarrierAnnounced(1, 1),
        BarrierAnnounced(2, 2),
        *completions("shopping", 0, {1: 1, 2: 2}),
        *completions("user_item_amount", 0, {1: 1, 2: 2}),
        *completions("user_item_price", 0, {1: 1, 2: 2}),
        RequestRevision("rev", "user_item_amount", 1),
        shopping_topology=True,
    )
    assert state.exact_points("user_item_amount") == {1: 1}
    assert state.exact_points("shopping") == {1: 1, 2: 2}
    state = fold_all(completions("user_item_amount", 1, {2: 3}), state)
    assert state.exact_points("user_item_amount") == {1: 1, 2: 3}
    assert state.tables["user_item_amount"].writers == (WriterTerm("amount_job", 0), WriterTerm("amount_job", 1))


def test_only_the_tables_writers_in_their_generations_add_exact_points(make_state: MakeState) -> None:
    """A completion from a job that never wrote the table, or from its writer in a generation it
    did not write, counts for nothing, wherever it was folded from."""
    state = make_state(
        *completions("shopping", 0, {1: 1}),
        *completions("shopping", 0, {2: 2}, job="price_job"),  # writes another table
        *completions("shopping", 0, {3: 3}, job="stranger"),  # never registered
        shopping_topology=True,
    )
    assert state.exact_points("shopping") == {1: 1}
    assert [state.counts(c) for c in state.completions["shopping"].values()] == [True, False, False]
    assert state.latest_exact("shopping") == 1 and state.common_barrier(["shopping"]) == 1


def test_a_replaced_writer_keeps_its_exact_points(make_state: MakeState) -> None:
    state = make_state(
        *completions("shopping", 0, {1: 1}),
        DeregisterJob("stop", "ingest_shopping", "CANCELED"),
        RegisterJob("again", "ingest_v2", "shopping", external_topics=("shopping_source",)),
        *completions("shopping", 0, {2: 2}, job="ingest_v2"),
        *completions("shopping", 0, {3: 3}),  # the stopped job's late runner
        shopping_topology=True,
    )
    assert state.tables["shopping"].writers == (WriterTerm("ingest_shopping", 0), WriterTerm("ingest_v2", 0))
    assert state.exact_points("shopping") == {1: 1, 2: 2, 3: 3}  # both wrote generation 0


def test_a_table_recorded_before_writers_were_kept_keeps_its_points_when_a_job_registers(make_state: MakeState) -> None:
    legacy = TableState("t", "root")  # writers None: as decoded from an older TableState record
    state = fold_all([legacy, *completions("t", 0, {1: 1, 2: 2}, job="old_job")])
    assert state.exact_points("t") == {1: 1, 2: 2}
    state = make_state(legacy, *completions("t", 0, {1: 1, 2: 2}, job="old_job"),
                       RegisterJob("r", "new_job", "t", external_topics=("x",)))
    assert state.tables["t"].writers == (WriterTerm("old_job", 0), WriterTerm("new_job", 0))
    assert state.exact_points("t") == {1: 1, 2: 2}
