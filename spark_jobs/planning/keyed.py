"""Plans of tables declared ``WITH ('state' = 'keyed')``: queries whose barrier touches random
old keys, kept in Spark's state store by key (``spark_jobs.runtime.maintenance.keyed`` runs
them), so a barrier costs a lookup per changed key instead of a read of the tables.

Two shapes are kept this way, each Spark's own stateful streaming operator:

* a **keyed join**: an INNER equi-join of two tables, each side's rows kept by join key; the
  joined rows of a barrier's new rows are appended;
* a **keyed aggregate**: a GROUP BY over one table that only grows, with COUNT, COUNT(*), SUM,
  AVG, MIN, MAX (and ``FILTER (WHERE ...)``), each group's running aggregates kept by group;
  the groups a barrier changed are MERGEd by the GROUP BY columns (or the table rewritten with
  them, where the job measured that cheaper: ``maintenance.writes.upsert_groups``).

Any other query declared keyed is a ``PipelineError``: the option is never silently ignored.
Each plan's ``change_query`` is the streaming query, the query plus ``BARRIER``: the newest
barrier among the rows that made a result row, so the rows a barrier made are found by it.
"""

from __future__ import annotations

from collections.abc import Mapping

import sqlglot
from sqlglot import exp

from coordinator.domain.snapshot import BARRIER
from coordinator.spark_sql import SPARK
from spark_jobs.planning.aggregates import aggregate_names, aggregate_parts
from spark_jobs.planning.joins import relations
from spark_jobs.planning.pipeline import PipelineError
from spark_jobs.planning.plan import UNKNOWN, Plan, PlanKind, TableShape, Unsupported

WRITES = {  # how a keyed aggregate's changed groups reach its table, by layout (changelog or not)
    False: "the groups they changed are MERGEd by the GROUP BY columns, or the table rewritten with them where the "
           "job measured that cheaper",
    True: "the groups they changed are appended (layout changelog: readers see each group's newest row), and the "
          "table compacted to one row a group after 100 appends, or sooner once they hold a tenth of its bytes",
}
HOW = "WITH ('state' = 'keyed') keeps an INNER equi-join of two tables, or a GROUP BY of one table that only grows"


def keyed_plan(name: str, query: str, shapes: Mapping[str, TableShape], changelog: bool = False) -> Plan:
    """The plan of table ``name`` declared keyed, whose ``query`` reads tables of ``shapes``
    (``changelog``: an aggregate's table in the changelog layout).

    >>> keyed_plan("t", "SELECT b.x, a.y FROM b JOIN a ON b.k = a.id", {}).change_query.split(" FROM ")[0]
    'SELECT b.x, a.y, GREATEST(b.__lockstep_barrier, a.__lockstep_barrier) AS __lockstep_barrier'
    >>> plan = keyed_plan("t", "SELECT k, SUM(v) AS s FROM b GROUP BY k", {"b": TableShape(None, True)})
    >>> str(plan.kind), plan.key, plan.change_query
    ('keyed_aggregate', (0,), 'SELECT k, SUM(v) AS s, MAX(__lockstep_barrier) AS __lockstep_barrier FROM b GROUP BY k')
    """
    tree = sqlglot.parse_one(query, read=SPARK)
    try:
        if not isinstance(tree, exp.Select) or any(s is not tree for s in tree.find_all(exp.Select)):
            raise Unsupported("it is not one SELECT (a UNION, a subquery or a CTE)")
        if any(tree.args.get(c) for c in ("having", "distinct", "qualify", "order", "limit", "laterals")) \
                or tree.find(exp.Window, exp.UDTF):
            raise Unsupported("it filters groups (HAVING), ranks, orders, takes DISTINCT rows or explodes its rows")
        if tree.args.get("group") or tree.find(exp.AggFunc):
            return _keyed_aggregate(tree, shapes, changelog)
        if changelog:
            raise Unsupported("WITH ('layout' = 'changelog') is a keyed aggregate's layout (a join's rows are appended "
                              "already)")
        return _keyed_join(tree)
    except Unsupported as exc:
        raise PipelineError(f"table {name}: {HOW} (no HAVING, window or subquery), but {exc}; remove the option") from None


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


def _keyed_aggregate(tree: exp.Select, shapes: Mapping[str, TableShape], changelog: bool) -> Plan:
    aliases, join = relations(tree)
    if join is not None:
        raise Unsupported("it aggregates a join (Spark's update mode keeps no join before an aggregate)")
    (source,) = set(aliases.values())
    if not shapes.get(source, UNKNOWN).append_only:
        raise Unsupported(f"{source} may update or delete rows (it has a primary key or is not append-only), which "
                          "running aggregates cannot take back")
    parts = aggregate_parts(tree, list(tree.expressions), "1")  # (checks the select list: group columns, aggregates)
    if any(a.func == "count_distinct" for a in parts.get("aggregates", ())):
        raise Unsupported("COUNT(DISTINCT ...) is not kept by Spark's streaming aggregation")
    streaming = tree.copy()
    streaming.select(f"MAX({BARRIER}) AS {BARRIER}", dialect=SPARK, copy=False)
    group = ", ".join(g.sql(dialect=SPARK) for g in tree.args["group"].expressions)
    return Plan(PlanKind.KEYED_AGGREGATE, f"GROUP BY {group} of {source}, which only grows, with "
                f"{aggregate_names(parts.get('aggregates', ()))}: each group's running aggregates kept in Spark's "
                "state store (RocksDB, checkpointed with the table), so a barrier's new rows update their groups by a "
                f"key lookup; {WRITES[changelog]}",
                tree.sql(dialect=SPARK), (source,), key=parts.get("key"), change_query=streaming.sql(dialect=SPARK),
                changelog=changelog)
