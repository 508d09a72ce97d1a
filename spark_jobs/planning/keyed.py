"""Plans of tables declared ``WITH ('state' = 'keyed')``: queries whose barrier touches random
old keys, kept in Spark's state store by key (``spark_jobs.runtime.maintenance.keyed`` runs
them), so a barrier costs a lookup per changed key instead of a read of the tables.

Three shapes are kept this way, each Spark's own stateful streaming operator:

* a **keyed join**: an INNER equi-join of two tables, each side's rows kept by join key; the
  joined rows of a barrier's new rows are appended;
* a **keyed aggregate**: a GROUP BY over one table that only grows (or a keyed join's table,
  which grows between its rebuilds: a rebuild of it rebuilds this state too), with COUNT,
  COUNT(*), SUM, AVG, MIN, MAX (and ``FILTER (WHERE ...)``), each group's running aggregates
  kept by group;
  the groups a barrier changed are MERGEd by the GROUP BY columns (or the table rewritten with
  them, where the job measured that cheaper: ``maintenance.writes.upsert_groups``);
* a **keyed Top-N**: the first N rows of each partition (``ROW_NUMBER() OVER (PARTITION BY ...
  ORDER BY ...) <= N``) of one such table, kept as a keyed aggregate whose one aggregate is
  Spark's ``max_by(row, order, N)``, each changed partition's rows written by partition and
  rank as an aggregate's groups are.

Any other query declared keyed is a ``PipelineError``: the option is never silently ignored.
Each plan's ``change_query`` is the streaming query, the query plus ``BARRIER``: the newest
barrier among the rows that made a result row, so the rows a barrier made are found by it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import sqlglot
from sqlglot import exp

from coordinator.domain.snapshot import BARRIER, HIDDEN
from coordinator.spark_sql import SPARK
from spark_jobs.planning.aggregates import aggregate_names, aggregate_parts
from spark_jobs.planning.joins import relations
from spark_jobs.planning.pipeline import PipelineError
from spark_jobs.planning.plan import COMPACT_APPENDS, COMPACT_SHARE, UNKNOWN, Plan, PlanKind, TableShape, TopN, Unsupported

WRITES = {  # how a keyed aggregate's changed rows (groups, or a partition's ranks) reach its table, by layout
    False: "the {rows} they changed are MERGEd by {key}, or the table rewritten with them where the job measured that "
           "cheaper",
    True: "the {rows} they changed are appended (layout changelog: readers see the newest row of each {key}), and the "
          f"table compacted to one row a key after {COMPACT_APPENDS} appends, or sooner once they hold "
          f"{COMPACT_SHARE:.0%} of its bytes",
}
HOW = ("WITH ('state' = 'keyed') keeps an INNER equi-join of two tables, or a GROUP BY or a ROW_NUMBER() <= N of one "
       "table that only grows or is a keyed join's")
TOP = f"{HIDDEN}top"  # a partition's first rows, an array of structs (ranked by position)


def keyed_plan(name: str, query: str, shapes: Mapping[str, TableShape], changelog: bool = False,
               joins: Collection[str] = ()) -> Plan:
    """The plan of table ``name`` declared keyed, whose ``query`` reads tables of ``shapes``
    (``changelog``: an aggregate's table in the changelog layout; ``joins``: the keyed joins'
    tables among them, which only grow between rebuilds).

    >>> keyed_plan("t", "SELECT b.x, a.y FROM b JOIN a ON b.k = a.id", {}).change_query.split(" FROM ")[0]
    'SELECT b.x, a.y, GREATEST(b.__lockstep_barrier, a.__lockstep_barrier) AS __lockstep_barrier'
    >>> plan = keyed_plan("t", "SELECT k, SUM(v) AS s FROM b GROUP BY k", {"b": TableShape(None, True)})
    >>> str(plan.kind), plan.key, plan.change_query
    ('keyed_aggregate', (0,), 'SELECT k, SUM(v) AS s, MAX(__lockstep_barrier) AS __lockstep_barrier FROM b GROUP BY k')
    """
    tree = sqlglot.parse_one(query, read=SPARK)
    try:
        if isinstance(tree, exp.Select) and isinstance(tree.args.get("from_") and tree.args["from_"].this, exp.Subquery) \
                and tree.find(exp.Window):
            return _keyed_top_n(tree, shapes, changelog, joins)
        if not isinstance(tree, exp.Select) or any(s is not tree for s in tree.find_all(exp.Select)):
            raise Unsupported("it is not one SELECT (a UNION, a subquery or a CTE)")
        if any(tree.args.get(c) for c in ("having", "distinct", "qualify", "order", "limit", "laterals")) \
                or tree.find(exp.Window, exp.UDTF):
            raise Unsupported("it filters groups (HAVING), ranks, orders, takes DISTINCT rows or explodes its rows")
        if tree.args.get("group") or tree.find(exp.AggFunc):
            return _keyed_aggregate(tree, shapes, changelog, joins)
        if changelog:
            raise Unsupported("WITH ('layout' = 'changelog') is a keyed aggregate's layout (a join's rows are appended "
                              "already)")
        return _keyed_join(tree)
    except Unsupported as exc:
        raise PipelineError(f"table {name}: {HOW} (no HAVING, other window or subquery), but {exc}; remove the option") \
            from None


def _keyed_join(tree: exp.Select) -> Plan:
    aliases, join = relations(tree)
    if join is None or len(join.tables) != 2 or join.side != "INNER" or not join.columns:
        raise Unsupported("it is not an INNER equi-join of two tables")
    left, right = join.tables
    alias = {t: a for a, t in aliases.items()}
    streaming = tree.copy()
    streaming.select(f"GREATEST({alias[left]}.{BARRIER}, {alias[right]}.{BARRIER}) AS {BARRIER}", dialect=SPARK, copy=False)
    on = " AND ".join(f"{left}.{a} = {right}.{b}" for a, b in zip(join.columns[left], join.columns[right], strict=True))
    return Plan(PlanKind.KEYED_JOIN, f"INNER equi-join on {on}, each side's rows kept by join key in Spark's state "
                "store (RocksDB, checkpointed with the table): a barrier's new rows find their matches by a key "
                "lookup, and the joined rows are appended; a barrier that updates or deletes a source row rebuilds "
                "the state from the sources' snapshots", tree.sql(dialect=SPARK), tuple(sorted(join.tables)),
                append_only=True, join_columns=join.columns, change_query=streaming.sql(dialect=SPARK))


def _keyed_aggregate(tree: exp.Select, shapes: Mapping[str, TableShape], changelog: bool, joins: Collection[str]) -> Plan:
    aliases, join = relations(tree)
    if join is not None:
        raise Unsupported("it aggregates a join (Spark's update mode keeps no join before an aggregate; make the "
                          "join a keyed table of its own, and aggregate that)")
    (source,) = set(aliases.values())
    grows = _grows(source, shapes, "running aggregates", joins)
    if not tree.args.get("group"):
        raise Unsupported("an aggregate without GROUP BY is one row: kept incrementally without 'state' = 'keyed'")
    parts = aggregate_parts(tree, list(tree.expressions), "1")  # (checks the select list: group columns, aggregates)
    if any(a.func == "count_distinct" for a in parts.get("aggregates", ())):
        raise Unsupported("COUNT(DISTINCT ...) is not kept by Spark's streaming aggregation")
    streaming = tree.copy()
    streaming.select(f"MAX({BARRIER}) AS {BARRIER}", dialect=SPARK, copy=False)
    group = ", ".join(g.sql(dialect=SPARK) for g in tree.args["group"].expressions)
    return Plan(PlanKind.KEYED_AGGREGATE, f"GROUP BY {group} of {source}, {grows}, with "
                f"{aggregate_names(parts.get('aggregates', ()))}: each group's running aggregates kept in Spark's "
                "state store (RocksDB, checkpointed with the table), so a barrier's new rows update their groups by a "
                f"key lookup; {WRITES[changelog].format(rows='groups', key='GROUP BY key')}",
                tree.sql(dialect=SPARK), (source,), key=parts.get("key"), change_query=streaming.sql(dialect=SPARK),
                changelog=changelog)


def _grows(source: str, shapes: Mapping[str, TableShape], kept: str, joins: Collection[str]) -> str:
    """How ``source`` grows (for the plan's reason); refuse one that may lose rows, which state of
    inserts only (``kept``) cannot take back. A keyed join's table (in ``joins``) only grows
    but when it is rebuilt (its sources updated or deleted a row), and its rebuild shows as a
    retraction among its changes, which rebuilds this state too (``runtime.maintenance.keyed``)."""
    if source in joins:
        return "a keyed join's table, which only grows between its rebuilds (each rebuilds this state too)"
    if not shapes.get(source, UNKNOWN).append_only:
        raise Unsupported(f"{source} may update or delete rows (it has a primary key or is not append-only), which "
                          f"{kept} cannot take back; a keyed join's table may be read instead (a join declared "
                          "WITH ('state' = 'keyed'))")
    return "which only grows"


def _keyed_top_n(tree: exp.Select, shapes: Mapping[str, TableShape], changelog: bool, joins: Collection[str]) -> Plan:
    """``SELECT * FROM (SELECT ..., ROW_NUMBER() OVER (PARTITION BY p ORDER BY o) AS r FROM t) WHERE
    r <= N`` over a table ``t`` that only grows: its partitions' rows can only move down a rank,
    so a partition changed by a barrier's new rows is written whole, its ranks replacing theirs."""
    inner = tree.args["from_"].this.this
    if not isinstance(inner, exp.Select) or not isinstance(inner.args.get("from_") and inner.args["from_"].this, exp.Table) \
            or any(s is not inner for s in inner.find_all(exp.Select)) \
            or any(tree.args.get(c) or inner.args.get(c) for c in
                   ("joins", "group", "having", "distinct", "qualify", "order", "limit", "laterals")):
        raise Unsupported("it is not SELECT ... FROM (SELECT ..., ROW_NUMBER() OVER (...) AS r FROM one table) WHERE r <= N "
                          "(a join may be a keyed table of its own, read by the Top-N)")
    windows = [w for w in inner.find_all(exp.Window) if isinstance(w.this, exp.RowNumber)]
    (window,) = windows if len(windows) == 1 and len(list(tree.find_all(exp.Window))) == 1 else (None,)
    if window is None or not window.args.get("partition_by") or not window.args.get("order") \
            or not isinstance(window.parent, exp.Alias) or window.parent.parent is not inner:
        raise Unsupported("it is not one ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...) AS r in the inner select list")
    rank = window.parent.alias
    limit = _limit(tree.args.get("where"), rank)
    source = inner.args["from_"].this.name
    grows = _grows(source, shapes, "a partition's first rows", joins)
    items = {i.alias_or_name: (None if i.unalias() is window else i.unalias().sql(dialect=SPARK)) for i in inner.expressions}
    if "" in items or any(i.is_star for i in inner.expressions):
        raise Unsupported("the inner select list has a * or an unnamed expression (name it with AS)")
    names = list(items) if tree.is_star else [i.alias_or_name for i in tree.expressions]
    if not tree.is_star and not all(isinstance(i, exp.Column) and i.name in items for i in tree.expressions):
        raise Unsupported("the outer select list is not * or columns of the inner one")
    partition = tuple(p.sql(dialect=SPARK) for p in window.args["partition_by"])
    key = [names.index(n) for n, e in items.items() if n in names and (e in partition or n == rank)]
    if len(key) != len(partition) + 1:
        raise Unsupported(f"the result does not hold every PARTITION BY column and {rank} (they identify its rows)")
    order = tuple((o.this.sql(dialect=SPARK), bool(o.args.get("desc")), bool(o.args.get("nulls_first")))
                  for o in window.args["order"].expressions)
    where = inner.args.get("where")
    top = TopN(inner.args["from_"].this.sql(dialect=SPARK), where.this.sql(dialect=SPARK) if where else None, partition,
               order, limit, tuple((n, items[n]) for n in names))
    first = "the first row" if limit == 1 else f"the first {limit} rows"
    return Plan(PlanKind.KEYED_AGGREGATE, f"{first} of each ({', '.join(partition)}) of {source}, {grows}: each "
                "partition's first rows kept in Spark's state store (RocksDB, checkpointed with the table) as a "
                "running max_by, so a barrier's new rows update their partitions by a key lookup; "
                + WRITES[changelog].format(rows="partitions' rows", key=f"partition and {rank}"),
                tree.sql(dialect=SPARK), (source,), key=tuple(sorted(key)), changelog=changelog, top_n=top)


def _limit(where: exp.Where | None, rank: str) -> int:
    """N of the outer ``WHERE rank <= N`` (or ``rank < N + 1``, ``rank = 1``)."""
    condition = where.this if where is not None else None
    if isinstance(condition, (exp.LTE, exp.LT, exp.EQ, exp.GTE, exp.GT)) and isinstance(condition.expression, exp.Column):
        flipped = {exp.GTE: exp.LTE, exp.GT: exp.LT}.get(type(condition), type(condition))
        condition = flipped(this=condition.expression, expression=condition.this)
    if isinstance(condition, (exp.LTE, exp.LT, exp.EQ)) and isinstance(condition.this, exp.Column) \
            and condition.this.name == rank and condition.expression.is_int:
        n = int(condition.expression.name) - isinstance(condition, exp.LT)
        if n >= 1 and (n == 1 or not isinstance(condition, exp.EQ)) and n <= 100_000:
            return n
    raise Unsupported(f"its outer WHERE is not {rank} <= N (1 <= N <= 100000, and nothing else)")


def top_n_query(top: TopN, types: Mapping[str, str]) -> str:
    """The streaming query of a keyed Top-N: each partition's first rows as one aggregate,
    Spark's ``max_by(row, order, N)`` (or ``min_by``), exploded into ranked rows. Its order is a
    struct compared field by field: a null flag and the value per ORDER BY expression, the value
    reversed where the expression's direction is not the aggregate's (``_reversed``), which needs
    its type (``types``: Spark's simple type name by expression), so the query is made at run
    time. Of the two aggregates, the one that reverses fewer strings and binaries is taken
    (``max_by`` on a tie).

    >>> top = TopN("bid", None, ("auction",), (("price", True, False), ("date_time", False, True)), 2,
    ...            (("auction", "auction"), ("price", "price"), ("r", None)))
    >>> print(top_n_query(top, {"price": "bigint", "date_time": "timestamp"}))  # doctest: +NORMALIZE_WHITESPACE
    SELECT __lockstep_row.auction AS auction, __lockstep_row.price AS price, __lockstep_rank + 1 AS r, __lockstep_barrier
    FROM (SELECT max_by(named_struct('auction', auction, 'price', price), struct(price IS NOT NULL, price,
    date_time IS NULL, ~unix_micros(date_time)), 2) AS __lockstep_top, MAX(__lockstep_barrier) AS __lockstep_barrier
    FROM bid GROUP BY auction) LATERAL VIEW posexplode(__lockstep_top) AS __lockstep_rank, __lockstep_row
    """
    ways = {largest: _order_fields(top, types, largest) for largest in (True, False)}

    def reversed_bytes(largest: bool) -> int:  # strings and binaries the way reverses (each complemented byte by byte)
        return sum(types[sql] in ("string", "binary") and descending != largest for sql, descending, _ in top.order)

    largest = min((w for w in ways if ways[w] is not None), key=lambda w: (reversed_bytes(w), not w), default=None)
    if largest is None:
        raise PipelineError(f"a keyed ROW_NUMBER() orders by {', '.join(s for s, _, _ in top.order)}, whose types "
                            f"({', '.join(types[s] for s, _, _ in top.order)}) cannot all be ordered one way: an "
                            "array or a struct only in the direction of the others; order them all one way or "
                            "remove the option")
    fields = ways[largest]
    assert fields is not None
    row = ", ".join(f"'{name}', {sql}" for name, sql in top.columns if sql is not None)
    select = ", ".join(f"{HIDDEN}row.{name} AS {name}" if sql is not None else f"{HIDDEN}rank + 1 AS {name}"
                       for name, sql in top.columns)
    where = f" WHERE {top.where}" if top.where else ""
    return (f"SELECT {select}, {BARRIER} FROM (SELECT {'max_by' if largest else 'min_by'}(named_struct({row}), "
            f"struct({fields}), {top.limit}) AS {TOP}, MAX({BARRIER}) AS {BARRIER} FROM {top.source}{where} "
            f"GROUP BY {', '.join(top.partition)}) LATERAL VIEW posexplode({TOP}) AS {HIDDEN}rank, {HIDDEN}row")


def _order_fields(top: TopN, types: Mapping[str, str], largest: bool) -> str | None:
    """The order struct's fields for ``max_by`` (``largest``) or ``min_by``; None if an ORDER BY
    expression would have to be reversed and cannot be."""
    fields = []
    for sql, descending, nulls_first in top.order:
        value = sql if descending == largest else _reversed(sql, types[sql])
        if value is None:
            return None
        fields += [f"{sql} IS {'' if nulls_first == largest else 'NOT '}NULL", value]
    return ", ".join(fields)


def _reversed(sql: str, kind: str) -> str | None:
    """An expression ordered the other way to ``sql`` of Spark type ``kind``, or None if none is
    (an array or a struct). A string's or binary's bytes are complemented (a hex digit d becomes
    F - d), with a 0xFF byte after them, so a prefix sorts after what extends it."""
    if kind in ("tinyint", "smallint", "int", "bigint"):
        return f"~({sql})"  # (-x overflows at the smallest value)
    if kind in ("float", "double") or kind.startswith("decimal"):
        return f"-({sql})"
    if kind == "string" or kind == "binary":
        raw = f"encode({sql}, 'UTF-8')" if kind == "string" else sql
        return f"concat(unhex(translate(hex({raw}), '0123456789ABCDEF', 'FEDCBA9876543210')), X'FF')"
    return {"timestamp": f"~unix_micros({sql})", "date": f"~unix_date({sql})", "boolean": f"NOT ({sql})"}.get(kind)
