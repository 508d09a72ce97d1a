"""What a maintenance plan says: the kinds of plan, the shapes tables promise their readers,
the aggregates a plan keeps, and the bookkeeping column names the runtime shares with the
planners (``spark_jobs.planning.plans`` makes plans; ``spark_jobs.runtime`` runs them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypedDict

from coordinator.domain.errors import LockstepError
from coordinator.domain.snapshot import HIDDEN

WEIGHT = f"{HIDDEN}w"  # +n / -n multiplicity of a change row
ROWS = f"{HIDDEN}rows"  # source rows in a group: the group disappears at 0
NUMBER = f"{HIDDEN}n"  # a row's number within its group, where no result columns identify a row
COMPACT_APPENDS = 100  # a changelog table's appends between two compactions, at most (``runtime.costs``)
COMPACT_SHARE = 0.1  # ... and the bytes they may hold, against the compacted table's


@dataclass(frozen=True)
class TableShape:
    """What a reader of a table can rely on: a unique key (None: rows have no identity) and
    whether the table only ever grows (root tables without a primary key)."""

    key: tuple[str, ...] | None
    append_only: bool


UNKNOWN = TableShape(None, False)


@dataclass(frozen=True)
class Aggregate:
    """One aggregate of the select list: ``func`` over ``arg`` (SQL), at select position ``position``."""

    func: str  # sum | count | count_star | avg | min | max | count_distinct
    arg: str | None
    position: int

    def hidden(self, index: int) -> dict[str, str]:
        """Bookkeeping columns this aggregate needs in the table: name -> SQL aggregate."""
        if self.func in ("sum", "avg"):
            out = {f"{HIDDEN}nn{index}": f"COUNT({self.arg})"}
            if self.func == "avg":
                out[f"{HIDDEN}sum{index}"] = f"SUM({self.arg})"
            return out
        return {}


@dataclass(frozen=True)
class TopN:
    """A keyed Top-N's parts (SQL): ``SELECT <columns> FROM (SELECT ..., ROW_NUMBER() OVER
    (PARTITION BY <partition> ORDER BY <order>) AS <rank> FROM <source> WHERE <where>) WHERE
    <rank> <= <limit>`` (``spark_jobs.planning.keyed.top_n_query`` makes its streaming query)."""

    source: str  # the FROM clause (a table, with its alias)
    where: str | None
    partition: tuple[str, ...]
    order: tuple[tuple[str, bool, bool], ...]  # (expression, descending, nulls first)
    limit: int
    columns: tuple[tuple[str, str | None], ...]  # the result's, in order: (name, expression; None for the rank)


class PlanKind(StrEnum):
    """How a table is maintained: incrementally in one of nine shapes, or recomputed."""

    PROJECTION = "projection"
    AGGREGATE = "aggregate"
    JOIN = "join"
    JOIN_AGGREGATE = "join_aggregate"
    GROUPS = "groups"
    UNION = "union"
    KEYED_JOIN = "keyed_join"  # WITH ('state' = 'keyed'): a join whose sides are kept by key in Spark's state store
    KEYED_AGGREGATE = "keyed_aggregate"  # WITH ('state' = 'keyed'): a GROUP BY whose groups are kept there
    ROW_WISE = "row-wise"  # a Python function applied to a source's changed rows (if it is row-wise)
    FULL_REFRESH = "full_refresh"


class PlanParts(TypedDict, total=False):
    """What a shape's planner contributes to a ``Plan`` (the fields of the same names)."""

    kind: PlanKind
    reason: str
    key: tuple[int | str, ...] | None
    append_only: bool
    inserts_only: bool
    group_positions: tuple[int, ...]
    aggregates: tuple[Aggregate, ...]
    change_query: str
    full_query: str
    join_columns: Mapping[str, tuple[str, ...]]
    group_columns: tuple[str, ...]
    group_sources: Mapping[str, tuple[str, ...]]
    reach: Mapping[str, str]


@dataclass(frozen=True)
class Plan:
    """The maintenance plan of one query: its ``kind`` (``PlanKind``) and why. ``key``
    identifies a result row: select positions (named at run time from the result's schema) or
    column names (``SELECT *``)."""

    kind: PlanKind
    reason: str
    query: str
    sources: tuple[str, ...] = ()
    key: tuple[int | str, ...] | None = None
    append_only: bool = False
    # one source that only grows: its change rows are all inserts (weight +1), never netted
    inserts_only: bool = False
    group_positions: tuple[int, ...] = ()
    aggregates: tuple[Aggregate, ...] = ()
    # FROM/JOIN/WHERE of the query with a select list of the change rows: the result columns
    # (projection, join) or group expressions and aggregate arguments (aggregates), plus WEIGHT
    change_query: str = ""
    full_query: str = ""  # the query plus the bookkeeping columns of aggregates
    # two-table join: source -> its equi-join columns (more tables: empty, joined by the delta rule)
    join_columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # groups: the result columns holding the group values, and each source's columns holding them
    group_columns: tuple[str, ...] = ()
    group_sources: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # groups of LEFT joins: each other table -> a query of the group values whose rows reach its
    # rows (bound to its changed rows); its rows are read whole
    reach: Mapping[str, str] = field(default_factory=dict)
    branches: tuple[Plan, ...] = ()  # union: each branch's plan
    changelog: bool = False  # a keyed aggregate's table in the changelog layout (``coordinator.domain.snapshot``)
    # sources in the changelog layout: their change rows come from a state of each key's last rows
    # (``spark_jobs.runtime.maintenance.changelog_changes``)
    changelog_sources: tuple[str, ...] = ()
    top_n: TopN | None = None  # a keyed Top-N's parts (its streaming query is made at run time, from them)

    @property
    def incremental(self) -> bool:
        return self.kind != PlanKind.FULL_REFRESH

    @property
    def keyed(self) -> bool:
        """Its table is kept in Spark's state store (``spark_jobs.runtime.maintenance.keyed``)."""
        return self.kind in (PlanKind.KEYED_JOIN, PlanKind.KEYED_AGGREGATE)

    @property
    def aggregated(self) -> bool:
        """Its table keeps groups with bookkeeping columns (a row count at least)."""
        return self.kind in (PlanKind.AGGREGATE, PlanKind.JOIN_AGGREGATE)

    @property
    def one_row(self) -> bool:
        """An aggregate without GROUP BY: one group, whose row stays when no source row is left."""
        return self.aggregated and self.key == ()

    def explain(self) -> str:
        if not self.incremental:
            return (f"full refresh: recompute the query over {', '.join(self.sources)} at their versions for "
                    f"each barrier where a source changed, because {self.reason}")
        how = self.kind.replace("_", " ") if self.keyed else self.kind.replace("_", " + ")
        return f"incremental {how}: {self.reason}"


class Unsupported(LockstepError):
    """The query is outside the incremental shapes; the message says why."""


class NoKey(Unsupported):
    """A join's result rows have no key (the groups shape may still keep it)."""


def output_key(plan: Plan, names: list[str]) -> tuple[str, ...] | None:
    """The plan's key as column names, given the result's column names in select order."""
    if plan.key is None:
        return None
    return tuple(names[k] if isinstance(k, int) else k for k in plan.key)
