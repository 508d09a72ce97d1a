"""decide() accepts valid commands with the facts they imply and rejects the rest with a reason."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain import (
    AbandonTable,
    AcquireLease,
    BarrierAnnounced,
    BarrierCompleted,
    DeclareTable,
    DeregisterJob,
    DropTable,
    JobState,
    MetaState,
    RegisterJob,
    ReleaseLease,
    RenewJob,
    RequestRevision,
    SourceVersion,
    TableState,
    Tombstone,
    decide,
    expire_leases,
    fold_all,
)
from coordinator.domain.decide import abandoned_tables
from coordinator.domain.leases import LeaseLimits
from coordinator.domain.roles import COMMAND_ROLES, Role, secret_digest

MakeState = Callable[..., MetaState]


def rejection(state: MetaState, command: object) -> str:
    decision = decide(state, command, now_ms=5)  # type: ignore[arg-type]
    assert not decision.outcome.accepted
    assert decision.facts == ()
    assert decision.outcome.request_id == command.request_id  # type: ignore[attr-defined]
    return decision.outcome.reason


def test_register_job_produces_job_and_writer(make_state: MakeState) -> None:
    state = make_state(DeclareTable("r1", "t", "root"))
    decision = decide(state, RegisterJob("r2", "j", "t", external_topics=("src",)), now_ms=7)
    assert decision.outcome.accepted
    job, table = decision.facts
    assert job == JobState("j", "t", (), ("src",), "", "RUNNING", 0, 0, None, "", 7, 7)
    assert isinstance(table, TableState) and table.writer == "j"
    assert decision.outcome.keys == ("job:j", "table:t")


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (DeclareTable("x", "bad name", "root"), "invalid table name 'bad name'"),
        (DeclareTable("x", "__meta", "root"), "reserved"),
        (DeclareTable("x", "x__dlq", "root"), "reserved"),
        (DeclareTable("x", "t", "view"), "invalid table kind 'view'"),
        (DeclareTable("x", "shopping", "intermediate"), "table 'shopping' already exists"),
        (DeclareTable("bad id with spaces", "t", "root"), "invalid request id"),
        (RegisterJob("x", "j", "nope", external_topics=("s",)), "unknown table 'nope'"),
        (RegisterJob("x", "j", "user_item_amount", sources=("missing",)), "unknown table 'missing'"),
        (RegisterJob("x", "j2", "shopping", external_topics=("s",)), "already has a writer: job 'ingest_shopping'"),
        (RegisterJob("x", "amount_job", "user_item_price", sources=("shopping",)), "duplicate job id 'amount_job'"),
        (RegisterJob("x", "1job", "user_item_amount", sources=("shopping",)), "invalid job id '1job'"),
        (RegisterJob("x", "j", "shopping", sources=("user_item_amount",)), "a root job reads external topics only"),
        (RegisterJob("x", "j", "user_item_amount", external_topics=("s",)), "reads other tables only"),
        (DeregisterJob("x", "ghost", "FINISHED"), "unknown job 'ghost'"),
        (DeregisterJob("x", "amount_job", "PAUSED"), "invalid status 'PAUSED'"),
        (AcquireLease("x", "l1", "me", ("shopping",), barrier=99, secret="s"), "no exact point at barrier 99"),
        (AcquireLease("x", "l1", "me", ("nope",), barrier=1, secret="s"), "unknown table 'nope'"),
        (AcquireLease("x", "l1", "me", (), barrier=1, secret="s"), "names no tables"),
        (AcquireLease("x", "l1", "me", ("shopping",), barrier=1, ttl_ms=0, secret="s"), "ttl 0 ms is out of range"),
        (ReleaseLease("x", "l9"), "unknown lease 'l9'"),
        (RequestRevision("x", "nope", 1), "unknown table 'nope'"),
        (RequestRevision("x", "shopping", 1, expected_generation=4), "stale generation: table 'shopping' is at generation 0"),
        (RequestRevision("x", "shopping", 50), "barrier 50 is not announced yet"),
    ],
)
def test_invalid_commands_are_rejected_with_a_reason(make_state: MakeState, command: object, reason: str) -> None:
    state = make_state(shopping_topology=True)
    assert reason in rejection(state, command)


def test_cycle_is_rejected_with_its_path(make_state: MakeState) -> None:
    state = make_state(
        DeclareTable("a", "t1", "intermediate"),
        DeclareTable("b", "t2", "intermediate"),
        DeclareTable("c", "t3", "intermediate"),
        RegisterJob("d", "j1", "t1", sources=("shopping", "t3")),
        RegisterJob("e", "j2", "t2", sources=("t1",)),
        shopping_topology=True,
    )
    reason = rejection(state, RegisterJob("f", "j3", "t3", sources=("t2",)))
    assert reason == "job 'j3' would create a cycle: t3 -> t1 -> t2 -> t3"
    assert rejection(state, RegisterJob("g", "j4", "t3", sources=("t3",))) == "job 'j4' would create a cycle: t3 -> t3"


def test_redeclaring_and_reregistering_the_same_thing_is_an_accepted_no_op(make_state: MakeState) -> None:
    """A no-op, so a command decided twice (a failover replays the commands after the last
    committed offset) changes nothing: a restarted runner renews its job with RenewJob."""
    state = make_state(shopping_topology=True)
    for command in (
        DeclareTable("z1", "shopping", "root", ("user_id", "item_id")),
        RegisterJob("z2", "amount_job", "user_item_amount", sources=("shopping",)),
    ):
        decision = decide(state, command, now_ms=10**6)
        assert decision.outcome.accepted and decision.facts == ()


def test_a_renewal_is_a_running_job_s_sign_of_life_and_never_restarts_an_ended_one(make_state: MakeState) -> None:
    state = make_state(shopping_topology=True, now_ms=1)
    decision = decide(state, RenewJob("r", "amount_job"), now_ms=5_000)
    assert decision.facts == (replace(state.jobs["amount_job"], updated_at_ms=5_000),)
    assert rejection(state, RenewJob("r", "nope")) == "unknown job 'nope'"
    ended = make_state(DeregisterJob("c", "amount_job", "CANCELED"), shopping_topology=True)
    assert "ended as CANCELED" in rejection(ended, RenewJob("r", "amount_job"))


def test_a_running_job_registered_with_a_changed_query_keeps_its_place_and_uses_the_new_query(
    make_state: MakeState,
) -> None:
    state = make_state(BarrierAnnounced(1, 100), BarrierCompleted("amount_job", "user_item_amount", 1, 0, 3),
                       shopping_topology=True)
    before = state.jobs["amount_job"]
    decision = decide(state, RegisterJob("z", "amount_job", "user_item_amount", ("shopping",), sql="SELECT 2"), 9)
    assert decision.outcome.accepted
    (job,) = decision.facts
    assert isinstance(job, JobState) and job.sql == "SELECT 2" and job.updated_at_ms == 9
    assert (job.generation, job.start_barrier, job.status) == (before.generation, before.start_barrier, "RUNNING")


def test_a_ctas_table_is_outside_the_catalog_until_its_first_barrier_is_committed(make_state: MakeState) -> None:
    from coordinator.domain.errors import Rejected
    from coordinator.domain.snapshot import resolve_snapshot

    state = make_state(
        DeclareTable("a", "totals", "intermediate", ctas=True),
        RegisterJob("b", "maintain_totals", "totals", sources=("shopping",)),
        BarrierAnnounced(1, 100),
        BarrierCompleted("ingest_shopping", "shopping", 1, 0, 4),
        shopping_topology=True,
    )
    assert state.pending() == ["totals"] and "totals" not in state.catalog()
    with pytest.raises(Rejected, match="being created"):
        resolve_snapshot(state, ["totals"])
    assert "already exists as a intermediate table made by CREATE TABLE AS SELECT" in rejection(
        state, DeclareTable("c", "totals", "intermediate"))
    state = make_state(
        DeclareTable("a", "totals", "intermediate", ctas=True),
        RegisterJob("b", "maintain_totals", "totals", sources=("shopping",)),
        BarrierAnnounced(1, 100),
        BarrierCompleted("ingest_shopping", "shopping", 1, 0, 4),
        BarrierCompleted("maintain_totals", "totals", 1, 0, 0),
        shopping_topology=True,
    )
    assert state.pending() == [] and "totals" in state.catalog()
    assert resolve_snapshot(state, ["totals", "shopping"]).versions == {"totals": 0, "shopping": 4}


def test_only_a_table_that_never_committed_and_nobody_runs_on_can_be_dropped(make_state: MakeState) -> None:
    state = make_state(
        DeclareTable("a", "totals", "intermediate", ctas=True),
        RegisterJob("b", "maintain_totals", "totals", sources=("shopping",)),
        shopping_topology=True,
    )
    assert "written by running job 'maintain_totals'" in rejection(state, DropTable("c", "totals"))
    stopped = make_state(DeregisterJob("c", "ingest_shopping", "FINISHED"), shopping_topology=True)
    assert "read by running job(s) amount_job, price_job" in rejection(stopped, DropTable("d", "shopping"))
    assert "unknown table 'nope'" in rejection(state, DropTable("c", "nope"))
    state = make_state(BarrierAnnounced(1, 100), BarrierCompleted("amount_job", "user_item_amount", 1, 0, 3),
                       DeregisterJob("c", "amount_job", "CANCELED"), shopping_topology=True)
    held = make_state(BarrierAnnounced(1, 100), BarrierCompleted("amount_job", "user_item_amount", 1, 0, 3),
                      DeregisterJob("c", "amount_job", "CANCELED"),
                      AcquireLease("l", "l1", "me", ("user_item_amount",), 1, 60_000, "s"), shopping_topology=True)
    assert "held by repeatable-read lease(s) l1" in rejection(held, DropTable("d", "user_item_amount"))
    dropped = decide(state, DropTable("d", "user_item_amount", "not needed"), 9)  # a table with data, nobody on it
    assert dropped.outcome.accepted and dropped.facts == (
        Tombstone("table:user_item_amount"), Tombstone("completion:user_item_amount@1"))
    state = make_state(
        DeclareTable("a", "totals", "intermediate", ctas=True),
        RegisterJob("b", "maintain_totals", "totals", sources=("shopping",)),
        DeregisterJob("c", "maintain_totals", "FAILED", "boom"),
        shopping_topology=True,
    )
    decision = decide(state, DropTable("d", "totals", "CTAS failed"), 9)
    assert decision.outcome.accepted and decision.facts == (Tombstone("table:totals"),)
    after = make_state(
        DeclareTable("a", "totals", "intermediate", ctas=True),
        RegisterJob("b", "maintain_totals", "totals", sources=("shopping",)),
        DeregisterJob("c", "maintain_totals", "FAILED", "boom"),
        DropTable("d", "totals"),
        DeclareTable("e", "totals", "intermediate"),  # the name is free again
        shopping_topology=True,
    )
    assert not after.tables["totals"].ctas


def test_a_job_registered_on_a_table_revised_while_stopped_starts_at_the_revision(make_state: MakeState) -> None:
    done = [BarrierCompleted("ingest_shopping", "shopping", b, 0, b) for b in (1, 2, 3)]
    state = make_state(
        *[BarrierAnnounced(b, 100 * b) for b in (1, 2, 3)], *done,
        DeregisterJob("x", "ingest_shopping", "FINISHED"),
        DeregisterJob("y", "amount_job", "FINISHED"),
        DeregisterJob("z", "price_job", "FINISHED"),
        RequestRevision("r", "shopping", 1),
        RegisterJob("s", "ingest_shopping", "shopping", external_topics=("shopping_source",)),
        shopping_topology=True,
    )
    job = state.jobs["ingest_shopping"]
    assert (job.generation, job.resume_barrier) == (1, 1)
    state = make_state(*[BarrierAnnounced(b, 100 * b) for b in (1, 2, 3)], *done, shopping_topology=True)
    assert state.jobs["ingest_shopping"].restart_from_barrier is None  # never revised: no restore


def test_deregister_frees_the_table_for_a_new_writer(make_state: MakeState) -> None:
    state = make_state(DeregisterJob("x", "amount_job", "CANCELED", "user stop"), shopping_topology=True)
    assert state.jobs["amount_job"].status == "CANCELED"
    assert state.tables["user_item_amount"].writer is None
    assert rejection(state, DeregisterJob("y", "amount_job", "FINISHED")) == "job 'amount_job' already ended as CANCELED"
    make_state(
        DeregisterJob("x", "amount_job", "CANCELED"),
        RegisterJob("y", "amount_job_v2", "user_item_amount", sources=("shopping",)),
        shopping_topology=True,
    )


def test_a_job_registered_again_after_it_ended_continues_from_its_tables_newest_exact_point(
    make_state: MakeState,
) -> None:
    state = make_state(
        BarrierAnnounced(1, 100),
        BarrierCompleted("ingest_shopping", "shopping", 1, 0, 4),
        DeregisterJob("x", "ingest_shopping", "FINISHED"),
        BarrierAnnounced(2, 200),
        BarrierAnnounced(3, 300),
        RegisterJob("y", "ingest_shopping", "shopping", external_topics=("shopping_source",)),
        shopping_topology=True,
    )
    assert state.jobs["ingest_shopping"].status == "RUNNING"
    assert state.jobs["ingest_shopping"].start_barrier == 1  # barriers 2 and 3 are still to be ingested
    assert state.jobs["amount_job"].start_barrier == 0  # a table without data starts at the newest barrier


def test_lease_holds_exact_point_versions_renews_and_expires(make_state: MakeState) -> None:
    state = make_state(
        BarrierAnnounced(1, 100),
        BarrierCompleted("ingest_shopping", "shopping", 1, 0, 4),
        BarrierCompleted("amount_job", "user_item_amount", 1, 0, 2),
        shopping_topology=True,
    )
    first = decide(state, AcquireLease("x", "l1", "reader", ("user_item_amount", "shopping"), 1, 50, "s1"), now_ms=10)
    (lease,) = first.facts
    assert lease.versions == (SourceVersion("shopping", 4), SourceVersion("user_item_amount", 2))
    assert (lease.acquired_at_ms, lease.expires_at_ms) == (10, 60)
    assert lease.secret_digest == secret_digest("s1") and "s1" not in repr(lease)  # the secret itself is kept nowhere
    assert "s1" not in repr(AcquireLease("x", "l1", "r", ("t",), 1, 50, "s1")) + repr(ReleaseLease("x", "l1", "s1"))
    state.leases["l1"] = lease
    renewed = decide(state, AcquireLease("y", "l1", "reader", ("shopping", "user_item_amount"), 1, 50, "s1"), now_ms=40)
    assert renewed.facts[0].expires_at_ms == 90 and renewed.facts[0].acquired_at_ms == 10
    assert "held by 'reader'" in rejection(state, AcquireLease("z", "l1", "other", ("shopping",), 1, secret="s1"))
    assert "only its holder renews it" in rejection(state, AcquireLease("z", "l1", "reader", ("shopping",), 1, 50, "s2"))
    assert "has no secret" in rejection(state, AcquireLease("z", "l2", "reader", ("shopping",), 1, 50))
    assert expire_leases(state, now_ms=59) == []
    assert expire_leases(state, now_ms=60) == [Tombstone("lease:l1")]
    assert decide(state, ReleaseLease("w", "l1", "s1"), now_ms=1, role=Role.READER).facts == (Tombstone("lease:l1"),)


def test_a_lease_is_released_only_with_its_holders_secret_or_by_an_operator(make_state: MakeState) -> None:
    state = make_state(BarrierAnnounced(1, 100), BarrierCompleted("ingest_shopping", "shopping", 1, 0, 4),
                       AcquireLease("x", "l1", "ann", ("shopping",), 1, 60_000, "ann's"), shopping_topology=True)
    for role in (Role.READER, Role.JOB):
        for secret in ("", "guess"):
            refused = decide(state, ReleaseLease("r", "l1", secret), now_ms=2, role=role)
            assert not refused.outcome.accepted and "released only by its holder" in refused.outcome.reason
        assert decide(state, ReleaseLease("r", "l1", "ann's"), now_ms=2, role=role).outcome.accepted
    assert decide(state, ReleaseLease("r", "l1"), now_ms=2, role=Role.OPERATOR).outcome.accepted


def test_readers_and_jobs_leases_are_capped_in_ttl_per_holder_and_in_all_and_an_operator_is_not(
        make_state: MakeState) -> None:
    state = make_state(BarrierAnnounced(1, 100), BarrierCompleted("ingest_shopping", "shopping", 1, 0, 4),
                       shopping_topology=True)
    limits = LeaseLimits(max_ttl_ms=1_000, per_holder=2, total=3)

    def take(lease_id: str, holder: str = "ann", ttl_ms: int = 500, role: Role = Role.READER) -> str:
        decision = decide(state, AcquireLease("r", lease_id, holder, ("shopping",), 1, ttl_ms, "s"), now_ms=2,
                          role=role, leases=limits)
        for fact in decision.facts:
            state.leases[fact.lease_id] = fact
        return decision.outcome.reason

    assert "more than the 1000 ms a reader may hold one (LOCKSTEP_LEASE_MAX_TTL_MS" in take("l0", ttl_ms=1_001)
    assert take("l0", "ops", ttl_ms=1_001, role=Role.OPERATOR) == ""  # an operator's override, up to a day
    assert "out of range: use 1 .. 86400000 ms" in take("lx", ttl_ms=86_400_001, role=Role.OPERATOR)
    assert take("l1") == take("l2") == ""
    assert "holder 'ann' already holds 2 leases" in take("l3") and "LOCKSTEP_LEASE_PER_HOLDER" in take("l3")
    assert take("l1") == ""  # renewing one it holds is no new lease
    assert "3 leases are held" in take("l3", holder="bob") and "LOCKSTEP_LEASE_TOTAL" in take("l3", holder="bob")
    assert take("l3", holder="bob", role=Role.OPERATOR) == ""
    assert "is not a name" in take("l4", holder="x" * 201, role=Role.OPERATOR)
    assert "is not a name" in take("l4", holder="ann\x1b[2J", role=Role.OPERATOR)
    assert "'" + "x" * 200 + "'" in take("l4", holder="x" * 5000, role=Role.OPERATOR)  # the answer stays short


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("command", sorted(COMMAND_ROLES))
def test_a_command_from_a_role_the_table_does_not_give_it_is_refused_before_its_rules(
        make_state: MakeState, role: Role, command: str) -> None:
    state = make_state(shopping_topology=True)
    sent = EXAMPLES[command]
    outcome = decide(state, sent, now_ms=2, role=role).outcome
    if role in COMMAND_ROLES[command]:
        assert "may not send" not in outcome.reason
    else:
        assert not outcome.accepted and f"the {role} role may not send {command}" in outcome.reason


def test_a_job_drops_only_a_ctas_table_that_never_committed(make_state: MakeState) -> None:
    state = make_state(DeclareTable("a", "pending_t", "intermediate", ctas=True), shopping_topology=True)
    assert decide(state, DropTable("d", "pending_t"), now_ms=2, role=Role.JOB).outcome.accepted
    stopped = make_state(DeregisterJob("c", "amount_job", "CANCELED"), shopping_topology=True)
    refused = decide(stopped, DropTable("d", "user_item_amount"), now_ms=2, role=Role.JOB).outcome
    assert not refused.accepted and "an operator's to drop" in refused.reason
    assert decide(stopped, DropTable("d", "user_item_amount"), now_ms=2, role=Role.OPERATOR).outcome.accepted


EXAMPLES = {
    "AcquireLease": AcquireLease("c", "l9", "me", ("shopping",), 1, 1000, "s"),
    "ReleaseLease": ReleaseLease("c", "l9", "s"),
    "DeclareTable": DeclareTable("c", "t9", "root"),
    "RegisterJob": RegisterJob("c", "j9", "shopping", external_topics=("x",)),
    "RenewJob": RenewJob("c", "amount_job"),
    "DeregisterJob": DeregisterJob("c", "amount_job", "CANCELED"),
    "DropTable": DropTable("c", "user_item_price"),
    "RequestRevision": RequestRevision("c", "shopping", 0, full=True),
    "AbandonTable": AbandonTable("c", "shopping", 10),
}


def test_revision_bumps_the_downstream_closure_only(make_state: MakeState) -> None:
    state = make_state(
        DeclareTable("a", "other", "root"),
        RegisterJob("b", "ingest_other", "other", external_topics=("o",)),
        BarrierAnnounced(1, 100),
        BarrierAnnounced(2, 200),
        *(BarrierCompleted(j, t, b, 0, b) for b in (1, 2) for j, t in
          [("ingest_shopping", "shopping"), ("amount_job", "user_item_amount"), ("price_job", "user_item_price")]),
        shopping_topology=True,
    )
    decision = decide(state, RequestRevision("x", "shopping", 1), now_ms=300)
    assert decision.outcome.accepted
    bumped = {f.name: f for f in decision.facts if isinstance(f, TableState)}
    assert sorted(bumped) == ["shopping", "user_item_amount", "user_item_price"]
    assert all(t.generation == 1 and t.generations[-1].from_barrier == 1 for t in bumped.values())
    jobs = {f.job_id: f for f in decision.facts if isinstance(f, JobState)}
    assert {j.restart_from_barrier for j in jobs.values()} == {1}
    assert "other" not in bumped and "ingest_other" not in jobs
    revised = fold_all(decision.facts, state.copy())
    again = decide(revised, RequestRevision("x", "shopping", 1), now_ms=400)  # read again after a failover
    assert again.outcome.accepted and again.facts == ()  # the generation is not bumped twice
    assert decide(revised, RequestRevision("y", "shopping", 1), now_ms=400).facts  # a new request revises again


def test_a_ctas_table_whose_job_died_before_its_first_commit_is_dropped(make_state: MakeState) -> None:
    pending = [DeclareTable("a", "totals", "intermediate", ctas=True),
               RegisterJob("b", "maintain_totals", "totals", sources=("shopping",))]
    state = make_state(*pending, shopping_topology=True, now_ms=1_000)  # registered at 1 s
    assert abandoned_tables(state, now_ms=60_000, liveness_ms=30_000) == []  # a restart may still come
    assert abandoned_tables(state, now_ms=62_000, liveness_ms=30_000) == ["totals"]
    decision = decide(state, AbandonTable("c", "totals", 60_000), now_ms=62_000)
    job, table = decision.facts
    assert (job.job_id, job.status, table) == ("maintain_totals", "FAILED", Tombstone("table:totals"))
    assert "went silent 61 s ago, before the first commit of totals" in job.reason
    renewed = fold_all(decide(state, RenewJob("c", "maintain_totals"), now_ms=50_000).facts, state.copy())
    assert abandoned_tables(renewed, now_ms=62_000, liveness_ms=30_000) == []  # a runner said it is alive
    after = fold_all(decision.facts, state.copy())
    assert "totals" not in after.tables and after.jobs["maintain_totals"].status == "FAILED"
    orphan = make_state(*pending, DeregisterJob("c", "maintain_totals", "FAILED", "boom"), shopping_topology=True)
    assert abandoned_tables(orphan, now_ms=2_000, liveness_ms=30_000) == []  # its own cleanup hook comes first
    assert decide(orphan, AbandonTable("d", "totals", 60_000), now_ms=62_000).facts == (Tombstone("table:totals"),)
    created = make_state(*pending, BarrierAnnounced(1, 100), BarrierCompleted("maintain_totals", "totals", 1, 0, 0),
                         shopping_topology=True)
    assert abandoned_tables(created, now_ms=10**9, liveness_ms=30_000) == []  # holds data: stays
    assert "holds its first commit" in rejection(created, AbandonTable("e", "totals", 0))


def test_a_pending_table_being_registered_is_never_taken_for_abandoned(make_state: MakeState) -> None:
    """`lockstep run` declares a CTAS table, then registers its job: in between the table has no
    job, and its declaration is its sign of life (it was counted from 1970 once)."""
    declared = make_state(DeclareTable("a", "totals", "intermediate", ctas=True), shopping_topology=True,
                          now_ms=10**9)
    assert declared.pending_sign_of_life("totals") == 10**9
    assert abandoned_tables(declared, now_ms=10**9 + 1, liveness_ms=30_000) == []
    assert abandoned_tables(declared, now_ms=10**9 + 60_001, liveness_ms=30_000) == ["totals"]
    # the leader proposed it from a state a moment old; a runner declared it again meanwhile:
    # decided in order, the proposal finds the new declaration and is rejected
    again = fold_all(decide(declared, DeclareTable("b", "totals", "intermediate", ctas=True), 10**9 + 60_002).facts,
                     declared.copy())
    assert again.pending_sign_of_life("totals") == 10**9 + 60_002
    late = decide(again, AbandonTable("c", "totals", 60_000), now_ms=10**9 + 60_003)
    assert not late.outcome.accepted and "showed a sign of life 0 s ago" in late.outcome.reason
    registered = make_state(DeclareTable("a", "totals", "intermediate", ctas=True),
                            RegisterJob("b", "maintain_totals", "totals", sources=("shopping",)), shopping_topology=True,
                            now_ms=10**9)
    assert decide(registered, RegisterJob("c", "maintain_totals", "totals", sources=("shopping",)), 10**9 + 5).facts == ()
    assert "unknown table 'nope'" in rejection(registered, AbandonTable("d", "nope", 0))


@settings(max_examples=300)
@given(gaps=st.lists(st.integers(0, 70_000), min_size=8, max_size=8),
       leader=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7), st.integers(0, 7)), max_size=6))
def test_no_interleaving_of_the_leader_s_abandonment_undoes_a_registration(
    gaps: list[int], leader: list[tuple[int, int, int]],
) -> None:
    """The start-up race behind a stalled aggregate: the leader's timer read a state in which a
    runner had declared its CTAS table but not yet registered its job, and dropped the table
    after the registration went through, leaving a RUNNING job whose completions never count
    (its table at its start barrier for ever, every read-committed read failing). Here the
    leader proposes from any state it may have read (``seen``, possibly stale), at any step
    (``step``), decided ``delay`` steps later, in order with the runner's commands. A RUNNING job
    always keeps its table, and a runner that keeps renewing never loses it."""
    runner = [DeclareTable("r0", "src", "root"), DeclareTable("r1", "totals", "intermediate", ctas=True),
              RegisterJob("r2", "maintain_totals", "totals", sources=("src",)),
              *(RenewJob(f"r{i}", "maintain_totals") for i in range(3, 8))]
    times = [sum(gaps[: i + 1]) for i in range(len(runner))]
    history, state = [MetaState()], MetaState()
    proposals: dict[int, list[AbandonTable]] = {}
    for step, command in enumerate(runner):
        for seen, at, delay in leader:
            if at == step:  # the leader proposes from the state it read at step ``seen`` (or the newest)
                stale = history[min(seen, len(history) - 1)]
                names = abandoned_tables(stale, times[step], liveness_ms=30_000)
                proposals.setdefault(step + delay, []).extend(AbandonTable(f"a{step}{n}", n, 60_000) for n in names)
        for proposal in proposals.pop(step, []):
            state = fold_all(decide(state, proposal, times[step]).facts, state.copy())
        state = fold_all(decide(state, command, times[step]).facts, state.copy())
        history.append(state)
        for job in state.active_jobs():
            assert job.sink in state.tables, f"job {job.job_id} runs without its table after step {step}"
    renewed_in_time = all(later - earlier <= 60_000 for earlier, later in zip(times[1:], times[2:], strict=False))
    if renewed_in_time:
        assert "totals" in state.tables and state.jobs["maintain_totals"].status == "RUNNING"
