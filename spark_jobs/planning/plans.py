"""How a derived table is maintained: an incremental plan for the query shapes Lockstep knows,
"full refresh" (with the reason) for everything else. Pure query analysis with sqlglot; the
Spark side that executes a plan is ``spark_jobs.runtime.ivm``.

Shapes maintained incrementally, all correct under upstream updates and deletes:

* **projection**: ``SELECT cols/exprs FROM t [WHERE ...]`` over one table. Changes are applied
  by the source's key (which must be selected) or appended when the source is append-only.
* **aggregate**: ``... GROUP BY`` with SUM, COUNT, COUNT(*), AVG, MIN, MAX, COUNT(DISTINCT)
  over one table or a two-table join (GROUP BY expressions such as ``window(ts, '1 minute')``
  and ``date_trunc`` too; a one-level ``SELECT DISTINCT`` is a GROUP BY of its columns).
  Invertible aggregates add signed deltas; MIN/MAX recompute only groups that lost their
  extreme value; COUNT(DISTINCT) recomputes the changed groups.
* **groups**: a query whose every GROUP BY, PARTITION BY and DISTINCT includes the same source
  columns, or columns its joins make equal (HAVING, Top-N per group, expressions over
  aggregates, subqueries and CTEs in FROM): the groups a barrier touches are recomputed
  (``spark_jobs.planning.groups``).
* **union**: UNION ALL of projections and joins, each branch kept as its own shape.

``AGG(x) FILTER (WHERE c)`` is kept as ``AGG(CASE WHEN c THEN x END)``.
* **join**: two-table INNER or LEFT equi-join, optionally followed by GROUP BY. The rows whose
  join key changed are recomputed from the other side's Delta snapshot (old and new versions),
  so no state of either side is copied into the job. INNER joins of three or more tables (star
  or chain) follow the delta rule: each changed table's changes joined with the others'
  snapshots. A table joined on its whole key to another's columns adds no key column. LEFT
  joins of three or more tables, grouped or not, are kept by group of the FROM table's rows.

Example::

    >>> shapes = {"shopping": TableShape(key=("user_id", "item_id"), append_only=False)}
    >>> plan = plan_query("SELECT user_id, SUM(amount) AS total FROM shopping GROUP BY user_id", shapes)
    >>> str(plan.kind), plan.key
    ('aggregate', (0,))
    >>> plan_query("SELECT user_id FROM shopping ORDER BY user_id", shapes).reason
    'ORDER BY / LIMIT: the result is not a set of rows that changes can be applied to'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypedDict

import sqlglot
from sqlglot import exp

from coordinator.domain.errors import LockstepError
from coordinator.domain.events import dead_letters
from coordinator.domain.snapshot import HIDDEN
from coordinator.spark_sql import SPARK
from spark_jobs.planning.groups import NotGrouped, conjuncts, groups_of
from spark_jobs.planning.pipeline import DerivedTable, Job, Pipeline, RootTable, tables_read

WEIGHT = f"{HIDDEN}w"  # +n / -n multiplicity of a change row
ROWS = f"{HIDDEN}rows"  # source rows in a group: the group disappears at 0
NUMBER = f"{HIDDEN}n"  # a row's number within its group, where no result columns identify a row

AGGREGATES = {exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max", exp.Count: "count"}


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


class PlanKind(StrEnum):
    """How a table is maintained: incrementally in one of seven shapes, or recomputed."""

    PROJECTION = "projection"
    AGGREGATE = "aggregate"
    JOIN = "join"
    JOIN_AGGREGATE = "join_aggregate"
    GROUPS = "groups"
    UNION = "union"
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
    """The maintenance plan of one query. ``kind`` is projection, aggregate, join,
    join_aggregate or full_refresh. ``key`` identifies a result row: select positions (named
    at run time from the result's schema) or column names (``SELECT *``)."""

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

    @property
    def incremental(self) -> bool:
        return self.kind != PlanKind.FULL_REFRESH

    @property
    def aggregated(self) -> bool:
        """Its table keeps groups with bookkeeping columns (a row count at least)."""
        return self.kind in (PlanKind.AGGREGATE, PlanKind.JOIN_AGGREGATE)

    def explain(self) -> str:
        if not self.incremental:
            return (f"full refresh: recompute the query over {', '.join(self.sources)} at their versions for "
                    f"each barrier where a source changed, because {self.reason}")
        return f"incremental {self.kind.replace('_', ' + ')}: {self.reason}"


class Unsupported(LockstepError):
    """The query is outside the incremental shapes; the message says why."""


class NoKey(Unsupported):
    """A join's result rows have no key (the groups shape may still keep it)."""


def plan_query(query: str, shapes: Mapping[str, TableShape]) -> Plan:
    """Analyse ``query`` (Spark SQL) given what is known about its source tables."""
    tree = sqlglot.parse_one(query, read=SPARK)
    sources = tables_read(tree)
    try:
        return _plan(tree, shapes, sources)
    except Unsupported as exc:
        return Plan(PlanKind.FULL_REFRESH, str(exc), query, sources=sources)


def _plan(tree: exp.Expression, shapes: Mapping[str, TableShape], sources: tuple[str, ...]) -> Plan:
    if isinstance(tree, exp.Union):
        return _union_plan(tree, shapes, sources)
    if not isinstance(tree, exp.Select):
        raise Unsupported(f"it is a {type(tree).__name__.upper()}, not a single SELECT")
    if tree.args.get("windows"):
        raise Unsupported("a named WINDOW clause is not maintained incrementally; write OVER (...) in place")
    if tree.args.get("order") or tree.args.get("limit") or tree.args.get("offset"):
        raise Unsupported("ORDER BY / LIMIT: the result is not a set of rows that changes can be applied to")
    for column in tree.find_all(exp.Column):
        if column.name.startswith(HIDDEN):
            raise Unsupported(f"column {column.name} uses the reserved prefix {HIDDEN}")
    tree = _distinct_as_group(tree)
    features = _group_features(tree)
    if features:
        try:
            parts = _groups_plan(tree, shapes, sources, features)
        except Unsupported:
            left = _left_joins(tree) if features == ["HAVING"] else None
            if left is None:
                raise
            parts = _left_joins_plan(tree, list(tree.expressions), *left, shapes)  # by group of the FROM table
        return Plan(query=tree.sql(dialect=SPARK), sources=sources, **parts)
    aliases, join = _relations(tree)
    items = list(tree.expressions)
    grouped = bool(tree.args.get("group")) or any(isinstance(i.unalias(), exp.AggFunc) for i in items)
    generator = _generator(tree)
    if generator and not grouped and not all(shapes.get(t, UNKNOWN).append_only for t in set(aliases.values())):
        raise Unsupported(f"{generator} makes any number of rows of one source row, so no source key finds them in "
                          "the result; over sources that only grow, its rows are appended")
    if join is not None:
        try:
            parts = _join_plan(tree, items, aliases, shapes, join, grouped)
        except NoKey as exc:
            try:  # rows without identity (bids only grow, have no key): replaced by the join columns' groups
                parts = _groups_plan(tree, shapes, sources, ["a join whose rows have no key"])
            except Unsupported:
                raise exc from None
    else:
        (source,) = set(aliases.values())
        try:
            parts = _single_plan(tree, items, shapes.get(source, UNKNOWN), grouped, source)
        except Unsupported as exc:
            if not grouped:
                raise
            try:  # an aggregate its arithmetic cannot keep (an expression over aggregates, ...): by group
                parts = _groups_plan(tree, shapes, sources, ["GROUP BY"])
            except Unsupported:
                raise exc from None
    return Plan(query=tree.sql(dialect=SPARK), sources=sources, **parts)


def _generator(tree: exp.Select) -> str | None:
    """The first generator (EXPLODE, INLINE, STACK ..., in the select list or a LATERAL VIEW) of
    ``tree``'s own SELECT, as written, or None. (Its weight goes along: an aggregate over its rows
    is kept like any other; its rows alone are not identified by their source row's key.)

    >>> _generator(sqlglot.parse_one("SELECT k, x FROM t LATERAL VIEW explode(a) e AS x", read=SPARK))
    'LATERAL VIEW EXPLODE'
    >>> [_generator(sqlglot.parse_one(q, read=SPARK)) for q in ("SELECT k, posexplode(a) FROM t", "SELECT k FROM t")]
    ['POSEXPLODE', None]
    """
    for lateral in tree.args.get("laterals") or ():
        return f"LATERAL VIEW {lateral.this.sql_name()}" if isinstance(lateral.this, exp.Func) else "LATERAL VIEW"
    for item in tree.expressions:
        if isinstance(found := item.unalias(), exp.UDTF):
            return found.sql_name() if isinstance(found, exp.Func) else type(found).__name__.upper()
    return None


def _union_plan(tree: exp.Union, shapes: Mapping[str, TableShape], sources: tuple[str, ...]) -> Plan:
    """UNION ALL of projections and joins: each branch's change rows, together. Its rows are
    identified by a constant that differs between branches plus each branch's key, at the same
    select positions in every branch (or it only grows, when every branch does)."""
    branches: list[exp.Expression] = []
    pending: list[exp.Expression] = [tree]
    while pending:
        node = pending.pop(0)
        if isinstance(node, exp.Union):
            if node.args.get("distinct"):
                raise Unsupported("UNION (without ALL) is not maintained incrementally; UNION ALL is")
            pending[:0] = [node.this, node.expression]
        else:
            branches.append(node)
    plans = []
    for number, branch in enumerate(branches, 1):
        try:
            plans.append(_plan(branch, shapes, tables_read(branch)))
        except Unsupported as exc:
            raise Unsupported(f"UNION ALL branch {number}: {exc}") from exc
    shapes_seen = {p.kind for p in plans}
    if not shapes_seen <= {PlanKind.PROJECTION, PlanKind.JOIN}:
        raise Unsupported(f"UNION ALL of {', '.join(sorted(shapes_seen))}: only projections and joins are combined")
    key: tuple[int | str, ...] | None = None
    if not all(p.append_only for p in plans):
        keys = {p.key for p in plans}
        width = min(len(b.selects) for b in branches)
        tags = [i for i in range(width) if all(isinstance(b.selects[i].unalias(), exp.Literal) for b in branches)
                and len({b.selects[i].unalias().sql(dialect=SPARK) for b in branches}) == len(branches)]
        (branch_key,) = keys if len(keys) == 1 else (None,)
        if not tags or not branch_key or not all(isinstance(k, int) for k in branch_key):
            raise Unsupported("UNION ALL of tables that change rows needs a key: select a different constant in "
                              "each branch (e.g. 'web' AS origin) and each branch's key columns at the same positions")
        key = (tags[0], *branch_key)
    return Plan(PlanKind.UNION, f"UNION ALL of {len(plans)} branches, each kept as its own shape: "
                + "; ".join(p.explain().removeprefix("incremental ") for p in plans),
                tree.sql(dialect=SPARK), sources=sources, key=key, append_only=key is None,
                inserts_only=all(p.inserts_only for p in plans), branches=tuple(plans))


def _distinct_as_group(tree: exp.Select) -> exp.Select:
    """``SELECT DISTINCT a, b FROM ...`` (one level, no aggregates) as ``... GROUP BY a, b``: the
    aggregate shape then keeps a row count per distinct row and drops a row when it reaches 0."""
    items = tree.expressions
    if (not tree.args.get("distinct") or tree.args.get("group") or any(s is not tree for s in tree.find_all(exp.Select))
            or tree.find(exp.Window) or any(i.is_star or i.find(exp.AggFunc) for i in items)):
        return tree
    grouped = tree.copy()
    grouped.set("distinct", None)
    grouped.set("group", exp.Group(expressions=[i.unalias().copy() for i in items]))
    return grouped


def _group_features(tree: exp.Select) -> list[str]:
    """What makes ``tree`` a query for the groups shape (``spark_jobs.planning.groups``)."""
    selects = list(tree.find_all(exp.Select))
    found = {"HAVING": any(s.args.get("having") for s in selects),
             "SELECT DISTINCT": any(s.args.get("distinct") for s in selects),
             "QUALIFY": any(s.args.get("qualify") for s in selects),
             "window functions": tree.find(exp.Window) is not None,
             "subqueries": len(selects) > 1}
    return [what for what, present in found.items() if present]


def _groups_plan(tree: exp.Select, shapes: Mapping[str, TableShape], sources: tuple[str, ...],
                 features: list[str]) -> PlanParts:
    what = ", ".join(features)
    try:
        groups = groups_of(tree, sources, {s: shapes.get(s, UNKNOWN).key for s in sources})
    except NotGrouped as exc:
        nested = tree.args.get("group") and any(s is not tree and s.args.get("group") for s in tree.find_all(exp.Select))
        hint = ("; an aggregate over an aggregate by other columns is kept incrementally when the inner query is a "
                "table of its own (CREATE TABLE ... AS the subquery) that the outer query reads") if nested else ""
        raise Unsupported(f"{what}: {exc}{hint}") from exc
    of = ", ".join(f"{s}({', '.join(c)})" for s, c in groups.sources.items())
    numbered = "" if groups.key else ", numbered within their group (no columns identify a row)"
    return PlanParts(kind=PlanKind.GROUPS, key=groups.key or (*groups.columns, NUMBER), group_columns=groups.columns,
                     group_sources=groups.sources,
                     reason=f"the groups ({', '.join(groups.columns)}) that a barrier's changes touch are recomputed "
                            f"from their rows of {of} and replace their rows{numbered} [{what}]")


@dataclass(frozen=True)
class _Joined:
    """The tables of a join, FROM table first; for two, each one's equi-join columns (more are
    joined by the delta rule, which needs none)."""

    tables: tuple[str, ...]
    columns: Mapping[str, tuple[str, ...]]
    side: str  # INNER or LEFT


def _many_joins(first: exp.Table, joins: list[exp.Join], aliases: dict[str, str]) -> _Joined:
    """Three or more tables: INNER and LEFT joins of plain tables, each with a condition, no
    table twice (LEFT when any join is)."""
    sides = set()
    for join in joins:
        if not isinstance(join.this, exp.Table):
            raise Unsupported(f"joined relation {join.this.sql(dialect=SPARK)[:60]} is not a plain table")
        side, what = _side(join)
        if side is None:
            raise Unsupported(f"{what} JOIN among more than two tables is not maintained incrementally (INNER and "
                              "LEFT joins are)")
        if not join.args.get("on") and not join.args.get("using"):
            raise Unsupported(f"JOIN {join.this.name} has no ON or USING (a cross join)")
        if join.this.name in aliases.values():
            raise Unsupported("self-joins are not maintained incrementally")
        aliases[join.this.alias_or_name] = join.this.name
        sides.add(side)
    return _Joined((first.name, *(j.this.name for j in joins)), {}, "LEFT" if "LEFT" in sides else "INNER")


def _side(join: exp.Join) -> tuple[str | None, str]:
    """INNER or LEFT (None for any other join), and how the query spells it."""
    side, kind = ((join.args.get(a) or "").upper() for a in ("side", "kind"))
    spelt = " ".join(x for x in (side, kind) if x)
    if side not in ("", "LEFT") or kind not in ("", "INNER", "OUTER") or (side == "" and kind == "OUTER"):
        return None, spelt
    return side or "INNER", spelt


def _relations(tree: exp.Select) -> tuple[dict[str, str], _Joined | None]:
    """alias -> table for FROM and its JOINs, and the join."""
    source = tree.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table):
        raise Unsupported("the FROM clause is not a plain table")
    aliases = {source.this.alias_or_name: source.this.name}
    join_list = tree.args.get("joins") or []
    if not join_list:
        return aliases, None
    if len(join_list) > 1:
        return aliases, _many_joins(source.this, join_list, aliases)
    join = join_list[0]
    if not isinstance(join.this, exp.Table):
        raise Unsupported("the joined relation is not a plain table")
    side, what = _side(join)
    if side is None:
        raise Unsupported(f"{what or 'this'} JOIN is not maintained incrementally (INNER and LEFT are)")
    left, right = source.this, join.this
    if left.name == right.name:
        raise Unsupported("self-joins are not maintained incrementally")
    aliases[right.alias_or_name] = right.name
    columns: dict[str, list[str]] = {left.name: [], right.name: []}
    if join.args.get("using"):
        for ident in join.args["using"]:
            columns[left.name].append(ident.name)
            columns[right.name].append(ident.name)
    else:
        on = join.args.get("on")
        for conjunct in conjuncts(on):
            if isinstance(conjunct, exp.EQ) and all(isinstance(s, exp.Column) for s in (conjunct.this, conjunct.expression)):
                owners = [aliases.get(c.table) for c in (conjunct.this, conjunct.expression)]
                if set(owners) == {left.name, right.name}:
                    for column, owner in zip((conjunct.this, conjunct.expression), owners, strict=True):
                        columns[owner].append(column.name)
                elif None in owners:
                    raise Unsupported(f"join condition {conjunct.sql()}: qualify both columns with their table")
    if not columns[left.name]:
        raise Unsupported("the join has no equality between a column of each table")
    return aliases, _Joined((left.name, right.name), {k: tuple(v) for k, v in columns.items()}, side)


def _classify(items: list[exp.Expression], group: list[exp.Expression]) -> tuple[tuple[int, ...], tuple[Aggregate, ...]]:
    """Split the select list into group columns and aggregates; anything else is unsupported."""
    for g in group:
        if isinstance(g, exp.Literal):
            raise Unsupported("GROUP BY by position is not maintained incrementally; name the columns")
        if not any(_selects(i, g) for i in items):
            raise Unsupported(f"GROUP BY {g.sql()} is not in the select list, so the table has no key")
    positions: list[int] = []
    aggregates: list[Aggregate] = []
    for position, item in enumerate(items):
        node = item.unalias()
        if any(_selects(item, g) for g in group):
            positions.append(position)
            continue
        condition = None
        if isinstance(node, exp.Filter) and isinstance(node.this, exp.AggFunc):  # AGG(x) FILTER (WHERE c)
            node, condition = node.this, node.expression.this
        agg = node if isinstance(node, exp.AggFunc) else None
        if agg is None or type(agg) not in AGGREGATES:
            what = "an expression over aggregates" if node.find(exp.AggFunc) else "not a GROUP BY column"
            raise Unsupported(f"select item {item.sql()} is {what} (supported: {', '.join(AGGREGATES.values())})")
        if any(a is not agg for a in agg.find_all(exp.AggFunc)):
            raise Unsupported(f"nested aggregate in {item.sql()}")
        func = AGGREGATES[type(agg)]
        arg: exp.Expression | None = agg.this
        if func == "count" and isinstance(arg, exp.Star):
            func, arg = "count_star", None
        elif isinstance(arg, exp.Distinct):
            if func != "count" or len(arg.expressions) != 1:
                raise Unsupported(f"{item.sql()}: only COUNT(DISTINCT one_column) is maintained incrementally")
            func, arg = "count_distinct", arg.expressions[0]
        if condition is not None:  # the aggregate of CASE WHEN c THEN x END: NULL where c does not hold
            func = "count" if func == "count_star" else func
            arg = exp.Case(ifs=[exp.If(this=condition.copy(), true=arg.copy() if arg is not None else exp.Literal.number(1))])
        aggregates.append(Aggregate(func, arg.sql(dialect=SPARK) if arg is not None else None, position))
    if len(positions) != len(group):
        raise Unsupported("each GROUP BY expression must appear exactly once in the select list")
    return tuple(positions), tuple(aggregates)


def _with_weight(tree: exp.Select, columns: list[exp.Expression], weight: str) -> str:
    """The query's FROM/JOIN/WHERE with ``columns`` and the change weight as its select list."""
    change = tree.copy()
    change.set("group", None)
    change.set("expressions", [*columns, exp.maybe_parse(f"{weight} AS {WEIGHT}", dialect=SPARK)])
    return change.sql(dialect=SPARK)


def _aggregate_parts(tree: exp.Select, items: list[exp.Expression], weight: str) -> PlanParts:
    group = list(tree.args["group"].expressions) if tree.args.get("group") else []
    if not group:
        raise Unsupported("an aggregate without GROUP BY (a single global row) is not maintained incrementally")
    positions, aggregates = _classify(items, group)
    columns = [items[p].unalias().copy().as_(f"{HIDDEN}g{i}") for i, p in enumerate(positions)]
    columns += [exp.maybe_parse(a.arg, dialect=SPARK).as_(f"{HIDDEN}a{i}")
                for i, a in enumerate(aggregates) if a.arg is not None]
    full = tree.copy()
    extra = [f"COUNT(*) AS {ROWS}"] + [f"{sql} AS {name}" for i, a in enumerate(aggregates) for name, sql in a.hidden(i).items()]
    full.set("expressions", [*full.expressions, *(exp.maybe_parse(e, dialect=SPARK) for e in extra)])
    return PlanParts(group_positions=positions, aggregates=aggregates, key=positions,
                     change_query=_with_weight(tree, columns, weight), full_query=full.sql(dialect=SPARK))


def _selected(items: list[exp.Expression], table_aliases: set[str], columns: tuple[str, ...]) -> tuple[int, ...] | None:
    """Select positions of plain references to ``columns`` of one table (None if one is missing)."""
    found: list[int] = []
    for name in columns:
        hits = [p for p, i in enumerate(items)
                if isinstance(i.unalias(), exp.Column) and i.unalias().name == name
                and (not i.unalias().table or i.unalias().table in table_aliases)]
        if not hits:
            return None
        found.append(hits[0])
    return tuple(found)


def _names(aggregates: tuple[Aggregate, ...]) -> str:
    if not aggregates:
        return "SELECT DISTINCT: a row count per distinct row"
    return ", ".join(a.func.upper().replace("_STAR", "(*)").replace("_DISTINCT", "(DISTINCT)") for a in aggregates)


def _single_plan(tree: exp.Select, items: list[exp.Expression], shape: TableShape, grouped: bool, source: str) -> PlanParts:
    if grouped:
        parts = _aggregate_parts(tree, items, WEIGHT)
        return PlanParts(parts, kind=PlanKind.AGGREGATE, inserts_only=shape.append_only,
                         reason=f"apply each barrier's changes of {source} (its Delta commits) "
                                f"to the changed groups only [{_names(parts['aggregates'])}]")
    star = any(isinstance(i, exp.Star) for i in items)
    key: tuple[int | str, ...] | None = None
    if shape.key is not None:
        key = shape.key if star else _selected(items, {source, tree.args["from_"].this.alias_or_name}, shape.key)
    if key is None and not shape.append_only:
        why = "has no key" if shape.key is None else f"key ({', '.join(shape.key)}) is not selected"
        raise Unsupported(f"{source} {why} and may update or delete rows: changed rows could not be found in the result")
    how = "appended (the source only grows)" if key is None else "applied by the source's key"
    change = tree.sql(dialect=SPARK) if star else _with_weight(tree, items, WEIGHT)  # * includes the weight
    return PlanParts(kind=PlanKind.PROJECTION,
                     reason=f"changes of {source} (its Delta commits) filtered, projected and {how}",
                     key=key, append_only=key is None, inserts_only=shape.append_only, change_query=change)


def _join_plan(tree: exp.Select, items: list[exp.Expression], aliases: dict[str, str],
               shapes: Mapping[str, TableShape], join: _Joined, grouped: bool) -> PlanParts:
    alias_of = {t: a for a, t in aliases.items()}
    columns = join.columns
    if join.side == "LEFT" and not columns:
        return _left_joins_plan(tree, items, aliases, join, shapes)
    if columns:
        left, right = join.tables
        weight = f"{alias_of[left]}.{WEIGHT} * COALESCE({alias_of[right]}.{WEIGHT}, 1)"
        how = (f"{join.side} equi-join on {left}({', '.join(columns[left])}) = {right}({', '.join(columns[right])}): "
               "rows whose join key changed are recomputed from both sides' Delta snapshots before and after the barrier")
    else:
        weight = " * ".join(f"{alias_of[t]}.{WEIGHT}" for t in join.tables)
        how = (f"INNER joins of {', '.join(join.tables)}: each changed table's changes are joined with the other "
               "tables' Delta snapshots (the delta rule: those before it at the barrier, those after it before), "
               "so no table is joined whole")
    if grouped:
        parts = _aggregate_parts(tree, items, weight)
        return PlanParts(parts, kind=PlanKind.JOIN_AGGREGATE, join_columns=columns,
                         reason=f"{how}, then their groups updated [{_names(parts['aggregates'])}]")
    key = _join_key(tree, items, aliases, shapes, join)
    all_grow = all(shapes.get(t, UNKNOWN).append_only for t in join.tables) and join.side == "INNER"
    if key is None and not all_grow:
        raise NoKey("the join's result has no key (select the key columns of every table not joined on its "
                    "whole key) and its inputs may change rows, so changed rows could not be found in the result")
    return PlanParts(kind=PlanKind.JOIN, reason=how, key=key, append_only=key is None,
                     change_query=_with_weight(tree, items, weight), join_columns=columns)


def _join_key(tree: exp.Select, items: list[exp.Expression], aliases: dict[str, str],
              shapes: Mapping[str, TableShape], join: _Joined) -> tuple[int | str, ...] | None:
    """Select positions that identify a row of a join: each table's selected key, where a table
    joined on its whole key to such tables' columns (a dimension) needs none; None if some
    table has neither."""
    if any(isinstance(i, exp.Star) for i in items):
        raise Unsupported("SELECT * over a join: name the columns")
    alias_of = {t: a for a, t in aliases.items()}
    selected = {t: None if shapes.get(t, UNKNOWN).key is None else
                _selected(items, {alias_of[t], t}, shapes.get(t, UNKNOWN).key or ()) for t in join.tables}
    determined = {t for t, found in selected.items() if found is not None}
    equal = _equated(tree, aliases)
    grew = True
    while grew:  # a table joined on its whole key to determined tables' columns has one row per their row
        more = {t for t in join.tables if t not in determined and shapes.get(t, UNKNOWN).key
                and all(any((t, k) in pair and (pair - {(t, k)}) and next(iter(pair - {(t, k)}))[0] in determined
                            for pair in equal) for k in shapes.get(t, UNKNOWN).key or ())}
        determined |= more
        grew = bool(more)
    return tuple(p for t in join.tables for p in selected[t] or ()) if determined == set(join.tables) else None


def _left_joins(tree: exp.Select) -> tuple[dict[str, str], _Joined] | None:
    """The aliases and the join of a query over LEFT joins of three or more tables, else None."""
    try:
        aliases, join = _relations(tree)
    except Unsupported:
        return None
    return (aliases, join) if join is not None and join.side == "LEFT" and not join.columns else None


def _left_joins_plan(tree: exp.Select, items: list[exp.Expression], aliases: dict[str, str], join: _Joined,
                     shapes: Mapping[str, TableShape]) -> PlanParts:
    """LEFT (and INNER) joins of three or more tables, by group of the FROM table's rows: every
    result row comes from one row of it (or, grouped, from the rows of one of its GROUP BY
    columns' values), so the groups of a column of it that the result selects (a GROUP BY
    column, else its key, else a column it is joined on) are recomputed when their rows, or
    rows they reach in the other tables, change. Another table's changed rows find their groups
    by the joins up to it (``Plan.reach``); its rows are read whole."""
    first = join.tables[0]
    alias = next(a for a, t in aliases.items() if t == first)
    group = list(tree.args["group"].expressions) if tree.args.get("group") else []
    if group:  # every result row is one group: of the FROM table's GROUP BY columns
        chosen = [(g.name, name) for g in group if isinstance(g, exp.Column) and g.table == alias
                  for name in [_named(items, alias, g.name)] if name]
        if not chosen:
            raise Unsupported(f"GROUP BY over LEFT joins of more than two tables: group by a column of {first} "
                              f"(qualified, e.g. {alias}.column, and selected as it is) too, so a change's groups "
                              "can be found by it")
    else:
        key_columns = shapes.get(first, UNKNOWN).key or ()
        chosen = [(c, _named(items, alias, c)) for c in key_columns]
        if not key_columns or not all(name for _, name in chosen):  # else the first column it is joined on
            joined = [c for pair in _equated(tree, aliases) for t, c in sorted(pair) if t == first]
            chosen = [(c, name) for c in joined for name in [_named(items, alias, c)] if name][:1]
        if not chosen:
            raise Unsupported(f"LEFT joins of more than two tables: select a column of {first} (its key, or a "
                              "column it is joined on) as it is, so a change's rows can be found by it")
    source_columns = tuple(c for c, _ in chosen)
    names = tuple(n for _, n in chosen if n)
    groups = [exp.column(c, table=alias).as_(f"{HIDDEN}g{i}") for i, c in enumerate(source_columns)]
    reach = {}
    for other in join.tables[1:]:
        path = tree.copy()
        for clause in ("where", "group", "having", "qualify", "order", "limit", "distinct"):
            path.set(clause, None)
        path.set("expressions", [g.copy() for g in groups])
        for j in path.args["joins"]:
            if j.this.name == other:  # the rows that reach the changed rows of `other`
                j.set("side", None)
                j.set("kind", None)
        reach[other] = path.sql(dialect=SPARK)
    key = _grouped_key(items, group) if group else _join_key(tree, items, aliases, shapes, join)
    return PlanParts(kind=PlanKind.GROUPS, key=key or (*names, NUMBER), group_columns=names,
                     group_sources={first: source_columns}, reach=reach,
                     reason=f"LEFT joins of {', '.join(join.tables)}, by group of {first}({', '.join(source_columns)}): "
                            f"the groups whose rows, or the rows they join in {', '.join(join.tables[1:])}, changed "
                            "are recomputed and replace their rows" + ("" if key else ", numbered within their group"))


def _grouped_key(items: list[exp.Expression], group: list[exp.Expression]) -> tuple[int, ...] | None:
    """The select positions of every GROUP BY expression (None if one is not selected)."""
    found = [next((p for p, i in enumerate(items) if _selects(i, g)), None) for g in group]
    return None if None in found else tuple(p for p in found if p is not None)


def _selects(item: exp.Expression, group_by: exp.Expression) -> bool:
    """Whether select ``item`` is the GROUP BY expression ``group_by``, as it is or by its alias."""
    return item.unalias().sql(dialect=SPARK) == group_by.sql(dialect=SPARK) or bool(item.alias) and item.alias == group_by.name


def _named(items: list[exp.Expression], alias: str, column: str) -> str | None:
    """The result name of ``alias.column`` where the select list has it as it is."""
    for item in items:
        node = item.unalias()
        if isinstance(node, exp.Column) and node.table == alias and node.name == column:
            return item.alias_or_name
    return None


def _equated(tree: exp.Select, aliases: dict[str, str]) -> list[set[tuple[str, str]]]:
    """The ``table.column = table.column`` conditions of the query's joins, as pairs of (table, column)."""
    pairs = []
    for join in tree.args.get("joins") or []:
        on = join.args.get("on")
        for c in conjuncts(on):
            if isinstance(c, exp.EQ) and all(isinstance(x, exp.Column) and x.table in aliases for x in (c.this, c.expression)):
                pairs.append({(aliases[c.this.table], c.this.name), (aliases[c.expression.table], c.expression.name)})
    return pairs


def output_key(plan: Plan, names: list[str]) -> tuple[str, ...] | None:
    """The plan's key as column names, given the result's column names in select order."""
    if plan.key is None:
        return None
    return tuple(names[k] if isinstance(k, int) else k for k in plan.key)


def shapes_of(roots: list[tuple[str, tuple[str, ...]]], derived: list[tuple[str, str]]) -> dict[str, TableShape]:
    """Shapes of a pipeline's tables (roots: name and primary key; derived: name and query,
    in definition order), so each plan knows what its sources promise."""
    shapes = {name: TableShape(key or None, not key) for name, key in roots}
    for name, query in derived:
        plan = plan_query(query, shapes)
        names = [i.alias_or_name for i in sqlglot.parse_one(query, read=SPARK).selects]
        key = output_key(plan, names)
        known = key is not None and "" not in key and NUMBER not in key  # (a row's number is no key to select)
        shapes[name] = TableShape(key if known else None, plan.append_only)
    return shapes


def plan_for(pipeline: Pipeline, table: DerivedTable) -> Plan:
    """The maintenance plan of a derived table, knowing the keys its sources promise (for a
    Python function's table: ``_python_plan``)."""
    shapes = shapes_of([(t.name, t.primary_key) for t in pipeline.roots],
                       [(t.name, t.query) for t in pipeline.derived if t.python is None])
    return plan_query(table.query, shapes) if table.python is None else _python_plan(table, shapes)


def _python_plan(table: DerivedTable, shapes: Mapping[str, TableShape]) -> Plan:
    """A Python function's table: its function applied to each barrier's changed rows where it
    reads one table that only grows (new rows, appended) or has a key (the rows of the changed
    keys, replaced), if it proves row-wise when the job starts; else recomputed."""
    assert table.python is not None
    function = f"{table.python.function.__name__} ({table.python.origin})"
    checked = "checked when its job starts, else recomputed"
    shape = shapes.get(table.sources[0], UNKNOWN)
    if len(table.sources) > 1:
        why = f"the Python function {function} reads {len(table.sources)} tables"
    elif shape.append_only:
        return Plan(PlanKind.ROW_WISE, f"each barrier's new rows of {table.sources[0]}, which only grows, go through "
                    f"{function} and are appended, if the function is row-wise (projections, filters, UDFs per row; "
                    f"{checked})", table.query, table.sources, append_only=True, inserts_only=True)
    elif shape.key is not None:
        key = ", ".join(shape.key)
        return Plan(PlanKind.ROW_WISE, f"each barrier's changed rows of {table.sources[0]} go through {function}, "
                    f"replacing the rows of the keys ({key}) they change, if the function is row-wise and keeps "
                    f"{key} as it is ({checked})", table.query, table.sources, key=shape.key)
    else:
        why = (f"the Python function {function} reads {table.sources[0]}, which has no key and may change or "
               "remove rows (a table that is recomputed)")
    return Plan(PlanKind.FULL_REFRESH, why, table.query, table.sources)


def explain_job(pipeline: Pipeline, job: Job) -> str:
    """How a job maintains its table, in one line (what `lockstep explain` prints)."""
    table = pipeline.table(job.sink)
    if isinstance(table, RootTable):
        how = f"upsert (MERGE) by key ({', '.join(table.primary_key)})" if table.primary_key else "append"
        if table.transactions:
            how += f", whole source transactions (their END markers in {table.transactions})"
        return (f"root ingestion from Kafka topic {table.topic}, format {table.format}, {how}; "
                f"one Delta commit per barrier, bad records to {dead_letters(table.name)}")
    return plan_for(pipeline, table).explain()
