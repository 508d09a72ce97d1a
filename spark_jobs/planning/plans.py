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
from dataclasses import replace

import sqlglot
from sqlglot import exp

from coordinator.domain.events import dead_letters
from coordinator.domain.snapshot import HIDDEN
from coordinator.domain.starts import meaning
from coordinator.spark_sql import SPARK
from spark_jobs.planning.aggregates import aggregate_names, aggregate_parts, selected, with_weight
from spark_jobs.planning.groups import NotGrouped, groups_of
from spark_jobs.planning.joins import join_plan, left_joins, left_joins_plan, relations
from spark_jobs.planning.keyed import keyed_plan
from spark_jobs.planning.pipeline import DerivedTable, Job, Pipeline, PipelineError, RootTable, tables_read
from spark_jobs.planning.plan import (
    NUMBER,
    UNKNOWN,
    WEIGHT,
    NoKey,
    Plan,
    PlanKind,
    PlanParts,
    TableShape,
    Unsupported,
    output_key,
)


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
            left = left_joins(tree) if features == ["HAVING"] else None
            if left is None:
                raise
            parts = left_joins_plan(tree, list(tree.expressions), *left, shapes)  # by group of the FROM table
        return Plan(query=tree.sql(dialect=SPARK), sources=sources, **parts)
    aliases, join = relations(tree)
    items = list(tree.expressions)
    grouped = bool(tree.args.get("group")) or any(_aggregates(i, tree) for i in items)
    generator = _generator(tree)
    if generator and not grouped and not all(shapes.get(t, UNKNOWN).append_only for t in set(aliases.values())):
        raise Unsupported(f"{generator} makes any number of rows of one source row, so no source key finds them in "
                          "the result; over sources that only grow, its rows are appended")
    if join is not None:
        try:
            parts = join_plan(tree, items, aliases, shapes, join, grouped)
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


def _aggregates(item: exp.Expression, select: exp.Select) -> bool:
    """Whether the select-list ``item`` aggregates ``select``'s rows: an aggregate function
    anywhere in it (``SUM(a) / COUNT(*)`` too), but not a window's (``SUM(a) OVER (...)``) nor
    a subquery's.

    >>> tree = sqlglot.parse_one("SELECT SUM(a) / COUNT(*), SUM(a) OVER (), (SELECT MAX(b) FROM u) FROM t")
    >>> [_aggregates(i, tree) for i in tree.expressions]
    [True, False, False]
    """
    return any(not agg.find_ancestor(exp.Window) and agg.find_ancestor(exp.Select) is select
               for agg in item.find_all(exp.AggFunc))


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


def _single_plan(tree: exp.Select, items: list[exp.Expression], shape: TableShape, grouped: bool, source: str) -> PlanParts:
    if grouped:
        parts = aggregate_parts(tree, items, WEIGHT)
        return PlanParts(parts, kind=PlanKind.AGGREGATE, inserts_only=shape.append_only,
                         reason=f"apply each barrier's changes of {source} (its Delta commits) "
                                f"to {'the changed groups only' if parts['key'] else 'its one row (no GROUP BY)'} "
                                f"[{aggregate_names(parts['aggregates'])}]")
    star = any(isinstance(i, exp.Star) for i in items)
    key: tuple[int | str, ...] | None = None
    if shape.key is not None:
        key = shape.key if star else selected(items, {source, tree.args["from_"].this.alias_or_name}, shape.key)
    if key is None and not shape.append_only:
        why = "has no key" if shape.key is None else f"key ({', '.join(shape.key)}) is not selected"
        raise Unsupported(f"{source} {why} and may update or delete rows: changed rows could not be found in the result")
    how = "appended (the source only grows)" if key is None else "applied by the source's key"
    change = tree.sql(dialect=SPARK) if star else with_weight(tree, items, WEIGHT)  # * includes the weight
    return PlanParts(kind=PlanKind.PROJECTION,
                     reason=f"changes of {source} (its Delta commits) filtered, projected and {how}",
                     key=key, append_only=key is None, inserts_only=shape.append_only, change_query=change)


def shapes_of(roots: list[tuple[str, tuple[str, ...]]], derived: list[tuple[str, str]]) -> dict[str, TableShape]:
    """Shapes of a pipeline's tables (roots: name and primary key; derived: name and query,
    in definition order), so each plan knows what its sources promise."""
    shapes = {name: TableShape(key or None, not key) for name, key in roots}
    for name, query in derived:
        plan = plan_query(query, shapes)
        names = [i.alias_or_name for i in sqlglot.parse_one(query, read=SPARK).selects]
        key = output_key(plan, names)
        # (a row's number is no key to select; nor is the empty key of an aggregate without GROUP BY)
        known = key is not None and key != () and "" not in key and NUMBER not in key
        shapes[name] = TableShape(key if known else None, plan.append_only)
    return shapes


def plan_for(pipeline: Pipeline, table: DerivedTable) -> Plan:
    """The maintenance plan of a derived table, knowing the keys its sources promise (for a
    Python function's table: ``_python_plan``)."""
    shapes = shapes_of([(t.name, t.primary_key) for t in pipeline.roots],
                       [(t.name, t.query) for t in pipeline.derived if t.python is None])
    changelogs = [t.name for t in pipeline.derived if t.changelog and t.name in table.sources]
    if changelogs and table.keyed:
        raise PipelineError(f"table {table.name}: WITH ('state' = 'keyed') reads tables that only grow or are joined "
                            f"by key, but {', '.join(changelogs)} has the changelog layout (its rows are replaced by "
                            "newer ones); remove the option, or the layout of what it reads")
    if changelogs and table.python is None:
        plan = plan_query(table.query, shapes)
        return replace(plan, changelog_sources=tuple(changelogs), reason=f"{plan.reason}; {', '.join(changelogs)} "
                       "in the changelog layout: each barrier's appended rows, with the rows they replace (each "
                       "key's last two rows kept in Spark's state store), are its change rows") \
            if plan.incremental else plan
    if changelogs:  # (a Python function's table: its changes are not the appended rows)
        return Plan(PlanKind.FULL_REFRESH, f"it reads {', '.join(changelogs)}, whose changelog layout keeps each "
                    "key's newest row at read time (its appended rows are no change rows)", table.query, table.sources)
    if table.keyed:  # (a keyed join's table is rebuilt, not retracted from: keyed state over it rebuilds too)
        joins = [t.name for t in pipeline.derived if t.name in table.sources and t.keyed and not t.changelog
                 and keyed_plan(t.name, t.query, shapes).kind == PlanKind.KEYED_JOIN]
        return keyed_plan(table.name, table.query, shapes, table.changelog, joins)
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
                f"one Delta commit per barrier, bad records to {dead_letters(table.name)}; a new table starts "
                f"reading {meaning(table.start)}")
    return plan_for(pipeline, table).explain()
