"""Plans of joins: the tables and equi-join columns of a FROM clause, two-table joins (their
rows recomputed by changed join key), INNER joins of more tables (the delta rule), the key of
a join's rows, and LEFT joins of three or more tables kept by group of the FROM table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import exp

from coordinator.domain.snapshot import HIDDEN
from coordinator.spark_sql import SPARK
from spark_jobs.planning.aggregates import aggregate_names, aggregate_parts, grouped_key, selected, with_weight
from spark_jobs.planning.groups import conjuncts
from spark_jobs.planning.plan import NUMBER, UNKNOWN, WEIGHT, NoKey, PlanKind, PlanParts, TableShape, Unsupported


@dataclass(frozen=True)
class Joined:
    """The tables of a join, FROM table first; for two, each one's equi-join columns (more are
    joined by the delta rule, which needs none)."""

    tables: tuple[str, ...]
    columns: Mapping[str, tuple[str, ...]]
    side: str  # INNER or LEFT


def _many_joins(first: exp.Table, joins: list[exp.Join], aliases: dict[str, str]) -> Joined:
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
    return Joined((first.name, *(j.this.name for j in joins)), {}, "LEFT" if "LEFT" in sides else "INNER")


def _side(join: exp.Join) -> tuple[str | None, str]:
    """INNER or LEFT (None for any other join), and how the query spells it."""
    side, kind = ((join.args.get(a) or "").upper() for a in ("side", "kind"))
    spelt = " ".join(x for x in (side, kind) if x)
    if side not in ("", "LEFT") or kind not in ("", "INNER", "OUTER") or (side == "" and kind == "OUTER"):
        return None, spelt
    return side or "INNER", spelt


def relations(tree: exp.Select) -> tuple[dict[str, str], Joined | None]:
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
    return aliases, Joined((left.name, right.name), {k: tuple(v) for k, v in columns.items()}, side)


def join_plan(tree: exp.Select, items: list[exp.Expression], aliases: dict[str, str],
               shapes: Mapping[str, TableShape], join: Joined, grouped: bool) -> PlanParts:
    alias_of = {t: a for a, t in aliases.items()}
    columns = join.columns
    if join.side == "LEFT" and not columns:
        return left_joins_plan(tree, items, aliases, join, shapes)
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
        parts = aggregate_parts(tree, items, weight)
        return PlanParts(parts, kind=PlanKind.JOIN_AGGREGATE, join_columns=columns,
                         reason=f"{how}, then {'their groups' if parts['key'] else 'its one row (no GROUP BY)'} "
                                f"updated [{aggregate_names(parts['aggregates'])}]")
    key = _join_key(tree, items, aliases, shapes, join)
    all_grow = all(shapes.get(t, UNKNOWN).append_only for t in join.tables) and join.side == "INNER"
    if key is None and not all_grow:
        raise NoKey("the join's result has no key (select the key columns of every table not joined on its "
                    "whole key) and its inputs may change rows, so changed rows could not be found in the result")
    return PlanParts(kind=PlanKind.JOIN, reason=how, key=key, append_only=key is None,
                     change_query=with_weight(tree, items, weight), join_columns=columns)


def _join_key(tree: exp.Select, items: list[exp.Expression], aliases: dict[str, str],
              shapes: Mapping[str, TableShape], join: Joined) -> tuple[int | str, ...] | None:
    """Select positions that identify a row of a join: each table's selected key, where a table
    joined on its whole key to such tables' columns (a dimension) needs none; None if some
    table has neither."""
    if any(isinstance(i, exp.Star) for i in items):
        raise Unsupported("SELECT * over a join: name the columns")
    alias_of = {t: a for a, t in aliases.items()}
    keys = {t: None if shapes.get(t, UNKNOWN).key is None else
            selected(items, {alias_of[t], t}, shapes.get(t, UNKNOWN).key or ()) for t in join.tables}
    determined = {t for t, found in keys.items() if found is not None}
    equal = _equated(tree, aliases)
    grew = True
    while grew:  # a table joined on its whole key to determined tables' columns has one row per their row
        more = {t for t in join.tables if t not in determined and shapes.get(t, UNKNOWN).key
                and all(any((t, k) in pair and (pair - {(t, k)}) and next(iter(pair - {(t, k)}))[0] in determined
                            for pair in equal) for k in shapes.get(t, UNKNOWN).key or ())}
        determined |= more
        grew = bool(more)
    return tuple(p for t in join.tables for p in keys[t] or ()) if determined == set(join.tables) else None


def left_joins(tree: exp.Select) -> tuple[dict[str, str], Joined] | None:
    """The aliases and the join of a query over LEFT joins of three or more tables, else None."""
    try:
        aliases, join = relations(tree)
    except Unsupported:
        return None
    return (aliases, join) if join is not None and join.side == "LEFT" and not join.columns else None


def left_joins_plan(tree: exp.Select, items: list[exp.Expression], aliases: dict[str, str], join: Joined,
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
    key = grouped_key(items, group) if group else _join_key(tree, items, aliases, shapes, join)
    return PlanParts(kind=PlanKind.GROUPS, key=key or (*names, NUMBER), group_columns=names,
                     group_sources={first: source_columns}, reach=reach,
                     reason=f"LEFT joins of {', '.join(join.tables)}, by group of {first}({', '.join(source_columns)}): "
                            f"the groups whose rows, or the rows they join in {', '.join(join.tables[1:])}, changed "
                            "are recomputed and replace their rows" + ("" if key else ", numbered within their group"))


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
