"""Select lists of grouped queries: which items are GROUP BY columns and which are aggregates
(and of what), the change query that carries each change row's weight, and the full query
with the bookkeeping columns an aggregate's table keeps."""

from __future__ import annotations

from sqlglot import exp

from coordinator.domain.snapshot import HIDDEN
from coordinator.spark_sql import SPARK
from spark_jobs.planning.plan import ROWS, WEIGHT, Aggregate, PlanParts, Unsupported

AGGREGATES = {exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max", exp.Count: "count"}


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


def with_weight(tree: exp.Select, columns: list[exp.Expression], weight: str) -> str:
    """The query's FROM/JOIN/WHERE with ``columns`` and the change weight as its select list."""
    change = tree.copy()
    change.set("group", None)
    change.set("expressions", [*columns, exp.maybe_parse(f"{weight} AS {WEIGHT}", dialect=SPARK)])
    return change.sql(dialect=SPARK)


def aggregate_parts(tree: exp.Select, items: list[exp.Expression], weight: str) -> PlanParts:
    """The parts of a grouped query; without GROUP BY, one global group (key ``()``), whose one
    row stays when its source is empty, as SQL's aggregate of no rows does."""
    group = list(tree.args["group"].expressions) if tree.args.get("group") else []
    positions, aggregates = _classify(items, group)
    columns = [items[p].unalias().copy().as_(f"{HIDDEN}g{i}") for i, p in enumerate(positions)]
    columns += [exp.maybe_parse(a.arg, dialect=SPARK).as_(f"{HIDDEN}a{i}")
                for i, a in enumerate(aggregates) if a.arg is not None]
    full = tree.copy()
    extra = [f"COUNT(*) AS {ROWS}"] + [f"{sql} AS {name}" for i, a in enumerate(aggregates) for name, sql in a.hidden(i).items()]
    full.set("expressions", [*full.expressions, *(exp.maybe_parse(e, dialect=SPARK) for e in extra)])
    return PlanParts(group_positions=positions, aggregates=aggregates, key=positions,
                     change_query=with_weight(tree, columns, weight), full_query=full.sql(dialect=SPARK))


def selected(items: list[exp.Expression], table_aliases: set[str], columns: tuple[str, ...]) -> tuple[int, ...] | None:
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


def aggregate_names(aggregates: tuple[Aggregate, ...]) -> str:
    if not aggregates:
        return "SELECT DISTINCT: a row count per distinct row"
    return ", ".join(a.func.upper().replace("_STAR", "(*)").replace("_DISTINCT", "(DISTINCT)") for a in aggregates)


def grouped_key(items: list[exp.Expression], group: list[exp.Expression]) -> tuple[int, ...] | None:
    """The select positions of every GROUP BY expression (None if one is not selected)."""
    found = [next((p for p, i in enumerate(items) if _selects(i, g)), None) for g in group]
    return None if None in found else tuple(p for p in found if p is not None)


def _selects(item: exp.Expression, group_by: exp.Expression) -> bool:
    """Whether select ``item`` is the GROUP BY expression ``group_by``, as it is or by its alias."""
    return item.unalias().sql(dialect=SPARK) == group_by.sql(dialect=SPARK) or bool(item.alias) and item.alias == group_by.name
