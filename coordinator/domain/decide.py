"""decide(state, command, now_ms) -> Decision: validate a request, produce the facts it implies.

The decider is the only writer of ``registry``, ``leases`` and ``outcomes``. A rejection
carries a reason a person can act on (which table is unknown, who already writes a table,
the cycle a job would close).

Example::

    >>> from coordinator.domain.state import MetaState
    >>> d = decide(MetaState(), RegisterJob("r1", "j", sink="nope"), now_ms=0)
    >>> d.outcome.accepted, d.outcome.reason
    (False, "unknown table 'nope': declare it first (lockstep emit declare-table nope ...)")
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from functools import singledispatch

from coordinator.domain.errors import Rejected
from coordinator.domain.events import (
    END_STATUSES,
    TABLE_KINDS,
    AbandonTable,
    AcquireLease,
    Command,
    CommandOutcome,
    DeclareTable,
    DeregisterJob,
    DropTable,
    Fact,
    GenerationStart,
    JobState,
    JobStatus,
    LeaseState,
    RegisterJob,
    ReleaseLease,
    RenewJob,
    RequestRevision,
    SourceVersion,
    TableKind,
    TableState,
    Tombstone,
    WriterTerm,
    completion_key,
    entity_key,
    lease_key,
    table_key,
)
from coordinator.domain.leases import LeaseLimits, lease_problem
from coordinator.domain.roles import Role, holds_secret, role_problem, secret_digest
from coordinator.domain.starts import EARLIEST, describe, rule_of, start_problem
from coordinator.domain.state import MetaState
from coordinator.domain.validity import name_problem, number_problem, token_problem

DEFAULT_LEASES = LeaseLimits()


@dataclass(frozen=True)
class Decision:
    facts: tuple[Fact | Tombstone, ...]
    outcome: CommandOutcome


def decide(state: MetaState, command: Command, now_ms: int, role: Role | None = None,
           leases: LeaseLimits = DEFAULT_LEASES) -> Decision:
    """Validate ``command`` against ``state``; accepted -> facts + outcome, else outcome only.

    ``role`` is the sender's (``coordinator.domain.roles``: the command topic it came from); the
    coordinator always passes it. None checks the rules of the state alone (their own tests).
    ``leases``: the caps on readers' and jobs' leases (``coordinator.domain.leases``)."""
    name = type(command).__name__
    try:
        _check_token("request id", command.request_id)
        if role is not None and (problem := role_problem(role, name)) is not None:
            raise Rejected(problem)
        if isinstance(command, AcquireLease) and (problem := lease_problem(command, state, role, leases)) is not None:
            raise Rejected(problem)
        facts = tuple(_decide(command, state, now_ms, role))
    except Rejected as exc:
        return Decision((), CommandOutcome(command.request_id, name, False, str(exc), (), now_ms))
    keys = tuple(entity_key(f) for f in facts)
    return Decision(facts, CommandOutcome(command.request_id, name, True, "", keys, now_ms))


def expire_leases(state: MetaState, now_ms: int) -> list[Tombstone]:
    """Tombstones for every lease whose expiry has passed (the coordinator's timer calls this)."""
    return [Tombstone(lease_key(lid)) for lid, lease in sorted(state.leases.items()) if lease.expires_at_ms <= now_ms]


def abandoned_tables(state: MetaState, now_ms: int, liveness_ms: int) -> list[str]:
    """CREATE TABLE AS SELECT tables still without their first commit that showed no sign of
    life (``MetaState.pending_sign_of_life``) for twice the liveness window: their runner was
    killed (``kill -9`` runs no cleanup hook) before that commit. The leader's timer proposes
    each with ``AbandonTable``, which is decided like every command: in order with a runner's
    declarations, registrations and renewals, so the check is made again against a state that
    holds all of them. An ended job's own cleanup hook drops its table sooner."""
    return [name for name in state.pending() if now_ms - state.pending_sign_of_life(name) > 2 * liveness_ms]


# -- validation helpers -------------------------------------------------------------------------


def _check_identifier(what: str, value: str) -> None:
    if (problem := name_problem(what, value)) is not None:
        raise Rejected(problem)


def _check_token(what: str, value: str) -> None:
    if (problem := token_problem(what, value)) is not None:
        raise Rejected(problem)


def _table(state: MetaState, name: str) -> TableState:
    table = state.tables.get(name)
    if table is None:
        raise Rejected(f"unknown table {name!r}: declare it first (lockstep emit declare-table {name} ...)")
    return table


# -- one handler per command ------------------------------------------------------------------


@singledispatch
def _decide(command: object, state: MetaState, now_ms: int, role: Role | None) -> list[Fact | Tombstone]:
    raise Rejected(f"unknown command type {type(command).__name__}")


@_decide.register
def _(cmd: DeclareTable, state: MetaState, now_ms: int, role: Role | None) -> list[Fact | Tombstone]:
    _check_identifier("table name", cmd.name)
    if cmd.kind not in TABLE_KINDS:
        raise Rejected(f"invalid table kind {cmd.kind!r} for {cmd.name!r}: use one of {', '.join(TABLE_KINDS)}")
    for column in cmd.primary_key:
        _check_identifier(f"primary key column of {cmd.name!r}", column)
    _check_start(cmd)
    existing = state.tables.get(cmd.name)
    if existing is not None:
        if (existing.kind, existing.primary_key, existing.schema, existing.ctas) == (
            cmd.kind, cmd.primary_key, cmd.schema, cmd.ctas
        ):
            if existing.kind == TableKind.ROOT and (cmd.start or EARLIEST) != rule_of(existing):
                raise Rejected(
                    f"table {cmd.name!r} started reading its topics as 'start' = {rule_of(existing)!r} said "
                    f"({describe(rule_of(existing), existing.start_offsets)}); 'start' = {cmd.start!r} applies "
                    f"to a new table only: set it back, or `lockstep drop {cmd.name}` and run the pipeline again"
                )
            again = existing if existing.table_id else replace(existing, table_id=_table_id(cmd))
            if not state.created(cmd.name):  # a runner starting again: its declaration is a sign of life
                return [replace(again, declared_at_ms=now_ms)]
            return [again] if again is not existing else []  # the same table again: a no-op, so pipelines can be re-run
        made = "by CREATE TABLE AS SELECT" if existing.ctas else "by a declaration"
        raise Rejected(
            f"table {cmd.name!r} already exists as a {existing.kind} table made {made} "
            f"(primary key {list(existing.primary_key)}); pick another name"
        )
    start = (cmd.start or EARLIEST) if cmd.kind == TableKind.ROOT else ""
    return [TableState(cmd.name, cmd.kind, cmd.primary_key, cmd.schema, declared_at_ms=now_ms, ctas=cmd.ctas, writers=(),
                       table_id=_table_id(cmd), start=start, start_offsets=cmd.start_offsets)]


def _check_start(cmd: DeclareTable) -> None:
    """A root table's start rule and the offsets it resolved to; other tables have none."""
    if cmd.kind != TableKind.ROOT and (cmd.start or cmd.start_offsets):
        raise Rejected(f"table {cmd.name!r} is {cmd.kind}: only a root table has a 'start' (it reads Kafka topics)")
    if cmd.start and (problem := start_problem(cmd.start)) is not None:
        raise Rejected(f"table {cmd.name!r}: {problem}")
    for entry in cmd.start_offsets:
        _check_token(f"start topic of {cmd.name!r}", entry.topic)
        if (problem := number_problem(f"start offset of {entry.topic}[{entry.partition}]", entry.offset)) is not None:
            raise Rejected(problem)


def _table_id(cmd: DeclareTable) -> str:
    """A new table's identity: from the request that declared it, so deciding that request again
    (after a failover) makes the same one, and any other declaration another."""
    return hashlib.sha256(f"{cmd.name}\0{cmd.request_id}".encode()).hexdigest()[:16]


@_decide.register
def _(cmd: DropTable, state: MetaState, now_ms: int, role: Role | None) -> list[Fact | Tombstone]:
    table = _table(state, cmd.name)
    if role == Role.JOB and (not table.ctas or state.created(cmd.name)):
        raise Rejected(f"the job role drops only a CREATE TABLE AS SELECT table before its first commit; "
                       f"{cmd.name!r} is an operator's to drop (docs/security.md)")
    writer = state.writer_of(cmd.name)
    if writer is not None:
        raise Rejected(f"table {cmd.name!r} is written by running job {writer.job_id!r}: stop it first "
                       f"(lockstep stop {writer.job_id})")
    readers = sorted(j.job_id for j in state.active_jobs() if cmd.name in j.sources)
    if readers:
        raise Rejected(f"table {cmd.name!r} is read by running job(s) {', '.join(readers)}: stop them first")
    leases = sorted(lid for lid, lease in state.leases.items() if any(v.table == cmd.name for v in lease.versions))
    if leases:
        raise Rejected(f"table {cmd.name!r} is held by repeatable-read lease(s) {', '.join(leases)}: "
                       "wait for their snapshots to close (or the leases to expire)")
    # the table and its exact points; the ended jobs that wrote it stay on record (lineage, delays)
    return [Tombstone(table_key(cmd.name)),
            *(Tombstone(completion_key(cmd.name, b)) for b in sorted(state.completions.get(cmd.name, {})))]


@_decide.register
def _(cmd: RegisterJob, state: MetaState, now_ms: int, role: Role | None) -> list[Fact | Tombstone]:
    _check_identifier("job id", cmd.job_id)
    sink = _table(state, cmd.sink)
    for source in cmd.sources:
        _table(state, source)
    for topic in cmd.external_topics:
        _check_token(f"topic of job {cmd.job_id!r}", topic)
    if sink.kind == TableKind.ROOT and (cmd.sources or not cmd.external_topics):
        raise Rejected(
            f"job {cmd.job_id!r} writes root table {cmd.sink!r}: a root job reads external topics only "
            f"(got sources {list(cmd.sources)}, topics {list(cmd.external_topics)})"
        )
    if sink.kind == TableKind.INTERMEDIATE and (not cmd.sources or cmd.external_topics):
        raise Rejected(
            f"job {cmd.job_id!r} writes intermediate table {cmd.sink!r}: it reads other tables only "
            f"(got sources {list(cmd.sources)}, topics {list(cmd.external_topics)})"
        )
    existing = state.jobs.get(cmd.job_id)
    if existing is not None and existing.status not in END_STATUSES:
        if existing.sink != cmd.sink:
            raise Rejected(
                f"duplicate job id {cmd.job_id!r}: a running job with that id writes {existing.sink!r}, "
                f"not {cmd.sink!r}; stop it first (lockstep stop {cmd.job_id}) or use another id"
            )
        if (existing.sources, existing.external_topics, existing.sql) == (cmd.sources, cmd.external_topics, cmd.sql):
            # The same job again: a no-op, so a command decided twice (after a failover) changes
            # nothing. A restarted runner shows its sign of life with RenewJob.
            return []
        _check_cycles(state, cmd)
        # A changed query: barriers the job commits from now on use it; `revise` recomputes earlier ones.
        redefined = replace(existing, sources=cmd.sources, external_topics=cmd.external_topics, sql=cmd.sql,
                            updated_at_ms=now_ms)
        return [redefined]
    writer = state.writer_of(cmd.sink)
    if writer is not None and writer.job_id != cmd.job_id:
        raise Rejected(f"table {cmd.sink!r} already has a writer: job {writer.job_id!r} (a table has one writer)")
    _check_cycles(state, cmd)
    # A table that already holds data (its job was stopped, or is replaced) is continued from
    # its newest exact point, so no input between that barrier and now is skipped.
    # A table revised while it had no running writer: its first job of the new generation starts
    # where the revision put it (and a root job restores the table to that point first).
    started = any(c.generation == sink.generation for c in state.completions.get(cmd.sink, {}).values())
    revised_from = sink.generations[-1].from_barrier if sink.generation > 0 and not started else None
    job = JobState(
        cmd.job_id,
        cmd.sink,
        cmd.sources,
        cmd.external_topics,
        cmd.sql,
        JobStatus.RUNNING,
        sink.generation,
        start_barrier=state.latest_exact(cmd.sink) or state.last_barrier(),
        restart_from_barrier=revised_from,
        registered_at_ms=now_ms,
        updated_at_ms=now_ms,
    )
    return [job, replace(sink, writer=cmd.job_id, writers=_with_writer(state, sink, cmd.job_id, sink.generation))]


def _with_writer(state: MetaState, table: TableState, job_id: str, generation: int) -> tuple[WriterTerm, ...]:
    """``table``'s writers with ``job_id`` in ``generation`` added. A table recorded before
    writers were kept starts from the jobs and generations of its completions, so its exact
    points stay what they were."""
    if table.writers is None:
        known = {WriterTerm(c.job_id, c.generation) for c in state.completions.get(table.name, {}).values()}
        writers = tuple(sorted(known, key=lambda w: (w.generation, w.job_id)))
    else:
        writers = table.writers
    term = WriterTerm(job_id, generation)
    return writers if term in writers else (*writers, term)


def _check_cycles(state: MetaState, cmd: RegisterJob) -> None:
    for source in cmd.sources:
        cycle = [source] if source == cmd.sink else state.path(cmd.sink, source)
        if cycle is not None:
            loop = " -> ".join([*cycle, cmd.sink]) if source != cmd.sink else f"{source} -> {source}"
            raise Rejected(f"job {cmd.job_id!r} would create a cycle: {loop}")


@_decide.register
def _(cmd: DeregisterJob, state: MetaState, now_ms: int, role: Role | None) -> list[Fact | Tombstone]:
    job = state.jobs.get(cmd.job_id)
    if job is None:
        raise Rejected(f"unknown job {cmd.job_id!r}")
    if cmd.status not in END_STATUSES:
        raise Rejected(f"invalid status {cmd.status!r} for job {cmd.job_id!r}: use one of {', '.join(END_STATUSES)}")
    if job.status in END_STATUSES:
        raise Rejected(f"job {cmd.job_id!r} already ended as {job.status}")
    facts: list[Fact | Tombstone] = [replace(job, status=cmd.status, reason=cmd.reason, updated_at_ms=now_ms)]
    sink = state.tables.get(job.sink)
    if sink is not None and sink.writer == job.job_id:
        facts.append(replace(sink, writer=None))
    return facts


@_decide.register
def _(cmd: RenewJob, state: MetaState, now_ms: int, role: Role | None) -> list[Fact | Tombstone]:
    job = state.jobs.get(cmd.job_id)
    if job is None:
        raise Rejected(f"unknown job {cmd.job_id!r}")
    if job.status in END_STATUSES:  # never brings a stopped job back
        raise Rejected(f"job {cmd.job_id!r} ended as {job.status}: stop its runner, or run it again")
    return [replace(job, updated_at_ms=now_ms)]


@_decide.register
def _(cmd: AcquireLease, state: MetaState, now_ms: int, role: Role | None) -> list[Fact | Tombstone]:
    _check_token("lease id", cmd.lease_id)
    if not cmd.tables:
        raise Rejected(f"lease {cmd.lease_id!r} names no tables")
    existing = state.leases.get(cmd.lease_id)
    if existing is not None and (existing.holder != cmd.holder or existing.barrier != cmd.barrier
                                 or not holds_secret(existing.secret_digest, cmd.secret)):
        raise Rejected(
            f"lease {cmd.lease_id!r} is held by {existing.holder!r} at barrier {existing.barrier}; only its "
            "holder renews it (with its secret): use another lease id"
        )
    if not cmd.secret:
        raise Rejected(f"lease {cmd.lease_id!r} has no secret: its holder keeps one to renew and release it "
                       "(open_snapshot makes one; lockstep emit acquire-lease --secret)")
    versions = []
    for name in sorted(set(cmd.tables)):
        _table(state, name)
        points = state.exact_points(name)
        if cmd.barrier not in points:
            raise Rejected(f"table {name!r} has no exact point at barrier {cmd.barrier}")
        versions.append(SourceVersion(name, points[cmd.barrier]))
    acquired = existing.acquired_at_ms if existing is not None else now_ms
    return [LeaseState(cmd.lease_id, cmd.holder, cmd.barrier, tuple(versions), acquired, now_ms + cmd.ttl_ms,
                       secret_digest(cmd.secret))]


@_decide.register
def _(cmd: ReleaseLease, state: MetaState, now_ms: int, role: Role | None) -> list[Fact | Tombstone]:
    lease = state.leases.get(cmd.lease_id)
    if lease is None:
        raise Rejected(f"unknown lease {cmd.lease_id!r} (already released or expired)")
    if role not in (None, Role.OPERATOR) and not holds_secret(lease.secret_digest, cmd.secret):
        raise Rejected(f"lease {cmd.lease_id!r} is released only by its holder, with its secret "
                       "(or by an operator: lockstep emit --as operator release-lease)")
    return [Tombstone(lease_key(cmd.lease_id))]


@_decide.register
def _(cmd: RequestRevision, state: MetaState, now_ms: int, role: Role | None) -> list[Fact | Tombstone]:
    table = _table(state, cmd.table)
    if cmd.request_id in table.revision_requests:
        return []  # decided before (a command read again after a failover): done already
    if cmd.expected_generation is not None and cmd.expected_generation != table.generation:
        raise Rejected(
            f"stale generation: table {cmd.table!r} is at generation {table.generation}, "
            f"the request was for generation {cmd.expected_generation}"
        )
    if cmd.to_barrier < 0 or cmd.to_barrier > state.last_barrier():
        raise Rejected(
            f"barrier {cmd.to_barrier} is not announced yet (last announced: {state.last_barrier()})"
        )
    start = 0 if cmd.full else cmd.to_barrier
    if start and start not in state.barriers:
        raise Rejected(f"barrier {start} is below the retention floor: the coordinator keeps the newest "
                       "LOCKSTEP_RETAIN_BARRIERS barriers (and newest exact points); revise to a newer barrier or --full")
    facts: list[Fact | Tombstone] = []
    for name in state.downstream(cmd.table):
        t = state.tables[name]
        if not cmd.full and start not in state.exact_points(name) and start != 0:
            raise Rejected(f"table {name!r} has no exact point at barrier {start}; revise to another barrier")
        generation = t.generation + 1
        requests = (*t.revision_requests, cmd.request_id) if name == cmd.table else t.revision_requests
        writer = state.writer_of(name)
        writers = t.writers if writer is None else _with_writer(state, t, writer.job_id, generation)
        facts.append(replace(t, generation=generation, generations=(*t.generations, GenerationStart(generation, start)),
                             revision_requests=requests, writers=writers))
        if writer is not None:
            facts.append(replace(writer, generation=generation, restart_from_barrier=start, updated_at_ms=now_ms))
    return facts


@_decide.register
def _(cmd: AbandonTable, state: MetaState, now_ms: int, role: Role | None) -> list[Fact | Tombstone]:
    _table(state, cmd.name)
    if state.created(cmd.name):
        raise Rejected(f"table {cmd.name!r} holds its first commit: it is not abandoned (lockstep drop {cmd.name})")
    silent = now_ms - state.pending_sign_of_life(cmd.name)
    if silent <= cmd.silent_ms:
        raise Rejected(f"table {cmd.name!r} showed a sign of life {max(silent, 0) // 1000} s ago: its runner is alive")
    out: list[Fact | Tombstone] = []
    writer = state.writer_of(cmd.name)
    if writer is not None and writer.status == JobStatus.RUNNING:
        out.append(replace(writer, status=JobStatus.FAILED, updated_at_ms=now_ms,
                           reason=f"its process went silent {silent // 1000} s ago, before the first commit of {cmd.name}"))
    out.append(Tombstone(table_key(cmd.name)))
    return out
