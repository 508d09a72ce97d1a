"""Which Delta version of each table a consistent read uses (the read levels: docs/reads.md).

>>> from coordinator.domain import BarrierCompleted, TableState, fold_all
>>> s = fold_all([TableState("a", "root"), BarrierCompleted("j", "a", 3, 0, 7)])
>>> resolve_snapshot(s, ["a"])
Snapshot(barrier=3, versions={'a': 7}, data_ts_ms=None)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from coordinator.domain.errors import Rejected, check_known
from coordinator.domain.state import MetaState

# Columns whose names start with this are a table's bookkeeping (an aggregate's sums and counts
# behind AVG, a group's row count): kept in the Delta table, never shown to a reader.
HIDDEN = "__lockstep_"
# A changelog table (``WITH ('layout' = 'changelog')``, docs/pipelines.md) appends each barrier's
# changed rows (APPENDED) to rows of one per key (compacted): a reader sees, for each ROW_KEY, its
# appended row of the newest BARRIER, else its compacted row (``latest_rows_sql``).
BARRIER = f"{HIDDEN}barrier"  # the barrier that wrote the row
ROW_KEY = f"{HIDDEN}key"  # the row's key as JSON (its GROUP BY values; a Top-N's partition and rank)
APPENDED = f"{HIDDEN}appended"  # appended since the table was last compacted (rewritten one row a key)


def is_changelog(columns: Sequence[str]) -> bool:
    """True for the columns of a changelog table, whose readers keep each key's newest row."""
    return ROW_KEY in columns


def latest_rows_sql(table: str, columns: Sequence[str]) -> str:
    """A query of ``columns`` of changelog ``table`` (a quoted name) as its readers see it: each
    key's appended row of the newest barrier, else its compacted row. Only the appended rows are
    ranked; the compacted ones are kept but for the keys appended since (an anti-join), so a read
    costs little more than a scan. A plain engine reading the Delta table runs the same query.

    >>> print(latest_rows_sql('"t"', ['"a"']))  # doctest: +NORMALIZE_WHITESPACE
    SELECT "a" FROM "t" WHERE NOT "__lockstep_appended" AND NOT EXISTS (SELECT 1 FROM "t" AS "__lockstep_new"
    WHERE "__lockstep_new"."__lockstep_appended" AND "__lockstep_new"."__lockstep_key" = "t"."__lockstep_key")
    UNION ALL SELECT "a" FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY "__lockstep_key" ORDER BY
    "__lockstep_barrier" DESC) AS "__lockstep_rank" FROM "t" WHERE "__lockstep_appended")
    WHERE "__lockstep_rank" = 1
    """
    shown, new = ", ".join(columns), f'"{HIDDEN}new"'
    return (f'SELECT {shown} FROM {table} WHERE NOT "{APPENDED}" AND NOT EXISTS (SELECT 1 FROM {table} AS {new} '
            f'WHERE {new}."{APPENDED}" AND {new}."{ROW_KEY}" = {table}."{ROW_KEY}")\n'
            f'UNION ALL SELECT {shown} FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY "{ROW_KEY}" ORDER BY '
            f'"{BARRIER}" DESC) AS "{HIDDEN}rank" FROM {table} WHERE "{APPENDED}") WHERE "{HIDDEN}rank" = 1')


class ReadLevel(StrEnum):
    """How a reader picks table versions (docs/reads.md); members compare equal to their names."""

    READ_COMMITTED = "read-committed"  # every table at the newest barrier that is an exact point of all
    REPEATABLE_READ = "repeatable-read"  # the same, plus a lease that keeps those versions from VACUUM
    READ_UNCOMMITTED = "read-uncommitted"  # each table's newest version, no coordination


@dataclass(frozen=True)
class Snapshot:
    """``data_ts_ms``: when the barrier whose data is read was announced (read-uncommitted: the
    oldest of the tables' newest exact points), so ``now - data_ts_ms`` is the read's staleness."""

    barrier: int | None
    versions: dict[str, int | None]
    data_ts_ms: int | None = None


def resolve_snapshot(
    state: MetaState,
    tables: Sequence[str],
    level: str = ReadLevel.READ_COMMITTED,
    as_of_barrier: int | None = None,
    as_of_timestamp: int | None = None,
) -> Snapshot:
    """Barrier and version per table, or Rejected with a reason a person can act on.

    ``read-uncommitted`` returns no versions (None: read each table's latest Delta version).
    """
    if level not in tuple(ReadLevel):
        raise Rejected(f"unknown read level {level!r}: use one of {', '.join(ReadLevel)}")
    if not tables:
        raise Rejected("name at least one table")
    check_known(tables, state.tables)
    pending = [t for t in tables if not state.created(t)]
    if pending:
        raise Rejected(f"table(s) {', '.join(pending)} are being created (CREATE TABLE AS SELECT): they can be "
                       "read once their first barrier is committed")
    if as_of_barrier is not None and as_of_timestamp is not None:
        raise Rejected("give as_of_barrier or as_of_timestamp, not both")
    if as_of_timestamp is not None:
        as_of_barrier = state.barrier_at(as_of_timestamp)
        if as_of_barrier is None:
            raise Rejected(f"no barrier was announced at or before timestamp {as_of_timestamp}")
    if as_of_barrier is not None:
        versions: dict[str, int | None] = {}
        for t in tables:
            points = state.exact_points(t)
            if as_of_barrier not in points:
                raise Rejected(f"table {t!r} has no exact point at barrier {as_of_barrier}")
            versions[t] = points[as_of_barrier]
        return Snapshot(as_of_barrier, versions, _announced_at(state, as_of_barrier))
    if level == ReadLevel.READ_UNCOMMITTED:
        newest = [state.latest_exact(t) for t in tables]
        oldest = None if None in newest else min(b for b in newest if b is not None)
        return Snapshot(None, {t: None for t in tables}, _announced_at(state, oldest))
    barrier = state.common_barrier(tables)
    if barrier is None:
        raise Rejected(f"tables {', '.join(tables)} have no common exact point yet")
    return Snapshot(barrier, {t: state.exact_points(t)[barrier] for t in tables}, _announced_at(state, barrier))


def epoch_ms(value: str) -> int:
    """A time a read may be as of: epoch milliseconds, or ISO-8601 (UTC unless it says otherwise);
    ``ValueError`` if it is neither.

    >>> epoch_ms("2026-11-21T20:00:00"), epoch_ms("1795291200000"), epoch_ms("2026-11-21 21:00:00+01:00")
    (1795291200000, 1795291200000, 1795291200000)
    """
    value = value.strip()
    if value.isdigit():
        return int(value)
    try:
        when = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"{value!r} is neither epoch milliseconds nor an ISO-8601 time") from exc
    return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp() * 1000)


def _announced_at(state: MetaState, barrier: int | None) -> int | None:
    announced = state.barriers.get(barrier) if barrier is not None else None
    return announced.ts_ms if announced is not None else None
