"""Every event Lockstep writes to Kafka, as frozen dataclasses.

Commands are requests (``lockstep.commands``); facts are the whole current state of one
entity (``lockstep.registry``, ``.barriers``, ``.completions``, ``.leases``) or an outcome
(``lockstep.outcomes``). Each event type has an Avro schema of the same name in
``schemas/``. Collections are tuples so events stay hashable and compare by value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

# -- small value types ---------------------------------------------------------------------


class TableKind(StrEnum):
    """What feeds a table: Kafka topics (root) or other tables (intermediate)."""

    ROOT = "root"
    INTERMEDIATE = "intermediate"


class JobStatus(StrEnum):
    """A job's status; events carry the value (members compare equal to their strings)."""

    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"
    # derived, never stored: RUNNING, but neither registered nor committed within the liveness
    # window (its process died or hangs); it holds no barrier back (MetaState.status_of)
    STALLED = "STALLED"


TABLE_KINDS: Final = tuple(TableKind)
END_STATUSES: Final = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED)
NO_PARTITIONS: Final = -1  # a CutEntry's partition for a topic measured when it did not exist yet


@dataclass(frozen=True)
class CutEntry:
    """End offset of one external topic-partition when a barrier was announced. A topic that did
    not exist yet has one entry with partition ``NO_PARTITIONS``: it was measured, and holds
    nothing. A topic with no entry was not measured (its job registered while the cut was taken),
    so no job of it may claim the barrier (``work.work_for``)."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class OffsetRange:
    """``[start, end)`` of one topic-partition that a root job read for a barrier."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class SourceVersion:
    """The Delta version of a source table that an intermediate job read (or a lease holds)."""

    table: str
    version: int


@dataclass(frozen=True)
class PhaseTime:
    """Milliseconds a job spent in one phase of a barrier (planning, the Spark write, ...)."""

    name: str
    ms: int


@dataclass(frozen=True)
class GenerationStart:
    """Generation ``generation`` of a table is valid for barriers after ``from_barrier``."""

    generation: int
    from_barrier: int


@dataclass(frozen=True)
class WriterTerm:
    """Job ``job_id`` wrote its table in generation ``generation``. Only such a pair's
    completions count: a job that never wrote the table, or wrote another generation, adds no
    exact point (a stale runner, a misrouted job, a completion naming the wrong job)."""

    job_id: str
    generation: int


# -- commands ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeclareTable:
    request_id: str
    name: str
    kind: str
    primary_key: tuple[str, ...] = ()
    schema: str = ""
    ctas: bool = False  # created by CREATE TABLE AS SELECT: hidden until its first exact point
    # a root table: where it starts reading its topics (``coordinator.domain.starts``; "": earliest)
    # and the offsets that rule resolved to when the declaring runner asked Kafka
    start: str = ""
    start_offsets: tuple[CutEntry, ...] = ()


@dataclass(frozen=True)
class RegisterJob:
    request_id: str
    job_id: str
    sink: str
    sources: tuple[str, ...] = ()
    external_topics: tuple[str, ...] = ()
    sql: str = ""


@dataclass(frozen=True)
class DeregisterJob:
    request_id: str
    job_id: str
    status: str
    reason: str = ""


@dataclass(frozen=True)
class RenewJob:
    """A runner's word that a running job of it is alive: a job whose table has no first
    commit yet has no other sign of life (the leader drops a pending table whose runner died)."""

    request_id: str
    job_id: str


@dataclass(frozen=True)
class AcquireLease:
    """Hold the versions of ``tables`` at exact point ``barrier``; the same id and secret renew."""

    request_id: str
    lease_id: str
    holder: str
    tables: tuple[str, ...]
    barrier: int
    ttl_ms: int = 60_000
    # the holder's proof: renewing and releasing need it (the lease keeps only its digest; never in a repr)
    secret: str = field(default="", repr=False)


@dataclass(frozen=True)
class ReleaseLease:
    request_id: str
    lease_id: str
    secret: str = field(default="", repr=False)  # the holder's secret; an operator may release any lease without it


@dataclass(frozen=True)
class RequestRevision:
    """Revise ``table`` and its downstream closure back to ``to_barrier`` (or from scratch)."""

    request_id: str
    table: str
    to_barrier: int
    full: bool = False
    expected_generation: int | None = None


@dataclass(frozen=True)
class DropTable:
    """Remove a table nobody runs on or holds a lease on, with its exact points (``lockstep
    drop``; a CTAS whose job ended before its first commit)."""

    request_id: str
    name: str
    reason: str = ""


@dataclass(frozen=True)
class AbandonTable:
    """The leader's proposal to drop CTAS table ``name``, still without its first commit, if
    nothing has shown a sign of life for it for ``silent_ms`` (``MetaState.pending_sign_of_life``).
    A command, not a fact the leader writes: it is decided in order with the declarations,
    registrations and renewals of a runner starting up, so it never undoes one of them."""

    request_id: str
    name: str
    silent_ms: int


Command = (DeclareTable | RegisterJob | DeregisterJob | RenewJob | AcquireLease | ReleaseLease | RequestRevision
           | DropTable | AbandonTable)

# -- facts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableState:
    name: str
    kind: str
    primary_key: tuple[str, ...] = ()
    schema: str = ""
    writer: str | None = None
    generation: int = 0
    generations: tuple[GenerationStart, ...] = (GenerationStart(0, 0),)
    declared_at_ms: int = 0
    ctas: bool = False
    revision_requests: tuple[str, ...] = ()  # RequestRevision ids done on this table: a repeat does nothing
    # every job and generation that wrote the table (DeclareTable starts it empty); None on a
    # table recorded before writers were kept: every completion of it counts until a job registers
    writers: tuple[WriterTerm, ...] | None = None
    # this table's identity, made when it was declared (a table of the same name declared again
    # after a drop, or in another coordinator, gets another): its Delta commits and its jobs'
    # streaming state carry it, so a job never continues another table's state; "": declared
    # before tables had one (its next declaration gives it one)
    table_id: str = ""
    # a root table: where it started reading its topics (``coordinator.domain.starts``; "": earliest),
    # and the offsets that resolved to when it was declared (a partition not listed: its first record)
    start: str = ""
    start_offsets: tuple[CutEntry, ...] = ()


@dataclass(frozen=True)
class JobState:
    job_id: str
    sink: str
    sources: tuple[str, ...] = ()
    external_topics: tuple[str, ...] = ()
    sql: str = ""
    status: str = JobStatus.RUNNING
    generation: int = 0
    start_barrier: int = 0
    restart_from_barrier: int | None = None
    reason: str = ""
    registered_at_ms: int = 0
    updated_at_ms: int = 0

    @property
    def resume_barrier(self) -> int:
        """The barrier the job's work starts after: its revision point, else its start."""
        return self.restart_from_barrier if self.restart_from_barrier is not None else self.start_barrier


@dataclass(frozen=True)
class TableStride:
    """``table`` commits only barriers that are multiples of ``every`` (``coordinator.domain.strides``):
    its barrier took ``cost_ms`` (median), against ``reference_ms`` for the pipeline's other jobs."""

    table: str
    every: int
    cost_ms: int
    reference_ms: int


@dataclass(frozen=True)
class BarrierAnnounced:
    barrier: int
    ts_ms: int
    cut: tuple[CutEntry, ...] = ()
    strides: tuple[TableStride, ...] = ()  # the tables that commit this barrier only if it is a multiple of their stride


@dataclass(frozen=True)
class BarrierCompleted:
    """Table ``table`` holds all input up to ``barrier`` at ``delta_version`` (an exact point)."""

    job_id: str
    table: str
    barrier: int
    generation: int
    delta_version: int
    rows_in: int = 0
    rows_out: int = 0
    rows_rejected: int = 0
    source_versions: tuple[SourceVersion, ...] = ()
    source_offsets: tuple[OffsetRange, ...] = ()
    started_at_ms: int = 0
    committed_at_ms: int = 0
    phases: tuple[PhaseTime, ...] = ()  # where the time between started and committed went
    fused_with: str = ""  # the leader job of the fused group that ran this barrier ("": the job's own query)


@dataclass(frozen=True)
class LeaseState:
    lease_id: str
    holder: str
    barrier: int
    versions: tuple[SourceVersion, ...]
    acquired_at_ms: int
    expires_at_ms: int
    secret_digest: str = ""  # roles.secret_digest of the holder's secret ("": held before leases had secrets)


@dataclass(frozen=True)
class CommandOutcome:
    request_id: str
    command: str
    accepted: bool
    reason: str = ""
    keys: tuple[str, ...] = ()
    decided_at_ms: int = 0


@dataclass(frozen=True)
class Tombstone:
    """A null value on a compacted state topic: the entity under ``key`` is gone."""

    key: str


Fact = TableState | JobState | BarrierAnnounced | BarrierCompleted | LeaseState
EVENT_TYPES: Final[tuple[type, ...]] = (
    DeclareTable,
    RegisterJob,
    DeregisterJob,
    RenewJob,
    AcquireLease,
    ReleaseLease,
    RequestRevision,
    DropTable,
    AbandonTable,
    TableState,
    JobState,
    BarrierAnnounced,
    BarrierCompleted,
    LeaseState,
    CommandOutcome,
)


def dead_letters(table: str) -> str:
    """The Delta table beside a root table that holds the records its job could not ingest.

    >>> dead_letters("shopping")
    'shopping__dlq'
    """
    return f"{table}__dlq"


def table_key(name: str) -> str:
    return f"table:{name}"


def job_key(job_id: str) -> str:
    return f"job:{job_id}"


def barrier_key(barrier: int) -> str:
    return f"barrier:{barrier}"


def completion_key(table: str, barrier: int) -> str:
    return f"completion:{table}@{barrier}"


def lease_key(lease_id: str) -> str:
    return f"lease:{lease_id}"


def split_key(key: str) -> tuple[str, str]:
    """``"completion:t@7"`` -> ``("completion", "t@7")``: the entity kind and its id.

    >>> split_key(completion_key("t", 7)), split_key(table_key("shopping"))
    (('completion', 't@7'), ('table', 'shopping'))
    """
    kind, _, ident = key.partition(":")
    return kind, ident


def entity_key(fact: Fact | Tombstone) -> str:
    """The compaction key of a fact: ``table:<name>``, ``job:<id>``, ``barrier:<b>``, ... (built
    here and by the ``*_key`` functions above only)."""
    match fact:
        case TableState(name=name):
            return table_key(name)
        case JobState(job_id=job_id):
            return job_key(job_id)
        case BarrierAnnounced(barrier=b):
            return barrier_key(b)
        case BarrierCompleted(table=table, barrier=b):
            return completion_key(table, b)
        case LeaseState(lease_id=lease_id):
            return lease_key(lease_id)
        case Tombstone(key=key):
            return key
    raise TypeError(f"{type(fact).__name__} is not a state fact")
