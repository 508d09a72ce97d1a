"""One rule for names and numbers, checked where commands are decided and where records are folded.

A table or job name is an identifier (letters, digits, underscores; not starting with a digit;
at most 128 characters) without ``__``, which is reserved for Lockstep's own tables
(``t__dlq``, ``__meta_*``): a table named ``x__dlq`` would share ``x``'s dead letters. Ids
and versions are whole numbers from 0 (barriers from 1) up to ``MAX_NUMBER``, so ``id + 1`` and
any JSON reader stay exact. ``record_problem`` is what every state reader asks before folding a
record: anyone who can write to the state topics can write anything, and one bad record must
be skipped, not folded (a barrier id of 2**63 - 1 would make the next announcement overflow on
every restart).

>>> name_problem("table", "orders"), name_problem("table", "x__dlq") is not None
(None, True)
>>> record_problem(BarrierAnnounced(2**63 - 1, 0), "barrier:9223372036854775807")
'barrier id 9223372036854775807 is outside 1..9007199254740992'
"""

from __future__ import annotations

import re

from coordinator.domain.events import (
    TABLE_KINDS,
    BarrierAnnounced,
    BarrierCompleted,
    CommandOutcome,
    JobState,
    JobStatus,
    LeaseState,
    TableState,
    Tombstone,
    entity_key,
)

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
TOKEN = re.compile(r"[A-Za-z0-9_.:@-]{1,200}")
RESERVED = "__"
MAX_NUMBER = 2**53
STORED_STATUSES = frozenset(s.value for s in JobStatus if s != JobStatus.STALLED)


def name_problem(what: str, value: str) -> str | None:
    """Why ``value`` cannot be the name of a table or job (``what``), or None."""
    if not IDENTIFIER.fullmatch(value or ""):
        return (f"invalid {what} {value!r}: use letters, digits and underscores, starting with a "
                "letter or underscore, at most 128 characters")
    if RESERVED in value:
        return f"invalid {what} {value!r}: names containing '{RESERVED}' are reserved for Lockstep's own tables"
    return None


def column_problem(value: str) -> str | None:
    """Why ``value`` cannot name a column of a Lockstep table, or None (``__`` starts Lockstep's
    own bookkeeping columns, e.g. ``__lockstep_count``)."""
    if not IDENTIFIER.fullmatch(value or ""):
        return (f"invalid column name {value!r}: use letters, digits and underscores, starting with a "
                "letter or underscore, at most 128 characters")
    if value.startswith(RESERVED):
        return f"invalid column name {value!r}: names starting with '{RESERVED}' are Lockstep's bookkeeping columns"
    return None


def token_problem(what: str, value: str) -> str | None:
    """Why ``value`` cannot be a request id, lease id or topic name (``what``), or None."""
    return None if TOKEN.fullmatch(value or "") else f"invalid {what} {value!r}: use 1-200 letters, digits or _ . : @ -"


def number_problem(what: str, value: int, lowest: int = 0) -> str | None:
    """Why ``value`` cannot be an id, version or offset (``what``), or None."""
    return None if lowest <= value <= MAX_NUMBER else f"{what} {value} is outside {lowest}..{MAX_NUMBER}"


def record_problem(record: object, key: str) -> str | None:
    """Why a decoded state record under ``key`` must not be folded, or None."""
    if isinstance(record, Tombstone | CommandOutcome):
        return None
    if not isinstance(record, TableState | JobState | BarrierAnnounced | BarrierCompleted | LeaseState):
        return f"a {type(record).__name__} is not a state fact"
    problems = [*_problems(record), None if entity_key(record) == key else f"its key {key!r} is not {entity_key(record)!r}"]
    return next((p for p in problems if p is not None), None)


def _problems(record: TableState | JobState | BarrierAnnounced | BarrierCompleted | LeaseState) -> list[str | None]:
    match record:
        case TableState():
            return [name_problem("table name", record.name),
                    None if record.kind in TABLE_KINDS else f"unknown table kind {record.kind!r}",
                    name_problem("writer", record.writer) if record.writer is not None else None,
                    number_problem("generation", record.generation),
                    *(number_problem("generation start", g.from_barrier) for g in record.generations),
                    *(name_problem("writer", w.job_id) or number_problem("writer's generation", w.generation)
                      for w in record.writers or ()),
                    *(token_problem("start topic", c.topic) or number_problem("start offset", c.offset)
                      for c in record.start_offsets)]
        case JobState():
            return [name_problem("job id", record.job_id), name_problem("sink", record.sink),
                    *(name_problem("source", s) for s in record.sources),
                    *(token_problem("topic", t) for t in record.external_topics),
                    None if record.status in STORED_STATUSES else f"unknown job status {record.status!r}",
                    number_problem("generation", record.generation), number_problem("start barrier", record.start_barrier)]
        case BarrierAnnounced():
            return [number_problem("barrier id", record.barrier, lowest=1), number_problem("barrier time", record.ts_ms),
                    *(token_problem("topic", c.topic) or number_problem("offset", c.offset) for c in record.cut),
                    *(name_problem("strided table", s.table) or number_problem("stride", s.every, lowest=1)
                      for s in record.strides)]
        case BarrierCompleted():
            return [name_problem("table name", record.table), name_problem("job id", record.job_id),
                    number_problem("barrier id", record.barrier), number_problem("version", record.delta_version),
                    number_problem("generation", record.generation),
                    *(number_problem("source version", v.version) for v in record.source_versions)]
        case LeaseState():
            return [token_problem("lease id", record.lease_id), number_problem("barrier id", record.barrier),
                    *(name_problem("table name", v.table) or number_problem("version", v.version) for v in record.versions)]
