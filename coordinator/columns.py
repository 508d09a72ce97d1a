"""Column-level lineage from SQL alone (sqlglot's ``lineage``): for each column of a maintained
table, the columns of its sources it is computed from. Shared by ``lockstep explain`` and the
jobs' OpenLineage events (from a pipeline file) and the worker's live page (from the state: root
tables' column DDL, jobs' queries), so it imports nothing of Lockstep's but its SQL dialect.

Example::

    >>> column_sources((("s", (("k", "BIGINT"), ("v", "BIGINT"))),),
    ...                (("t", "SELECT k, SUM(v) * 2 AS total, COUNT(*) AS n FROM s GROUP BY k"),))
    {'t': {'k': ['s.k'], 'total': ['s.v'], 'n': []}}
"""

from __future__ import annotations

import functools

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.lineage import lineage
from sqlglot.optimizer.qualify import qualify

from coordinator.spark_sql import SPARK

Schemas = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # ((table, ((column, type), ...)), ...)


@functools.lru_cache(maxsize=32)  # the page asks every second; the answer changes with the pipeline only
def column_sources(schemas: Schemas, queries: tuple[tuple[str, str], ...]) -> dict[str, dict[str, list[str]] | None]:
    """Per table of ``queries`` ((table, Spark SQL), any order), output column -> its source
    columns (``table.column``, sorted; none for a constant or ``COUNT(*)``), given the columns of
    the tables ``schemas`` declares. None for a query that reads a table whose columns are
    unknown (neither declared nor made by another of ``queries``)."""
    known: dict[str, dict[str, str]] = {table: dict(columns) for table, columns in schemas}
    out: dict[str, dict[str, list[str]] | None] = {}
    pending = list(queries)
    while pending:  # a query after those that make its sources
        ready = [(t, q) for t, q in pending if not _reads(q) & {p for p, _ in pending if p != t}] or pending[:1]
        for table, query in ready:
            pending.remove((table, query))
            try:
                tree = qualify(sqlglot.parse_one(query, read=SPARK), schema=dict(known), dialect=SPARK)
                if not isinstance(tree, exp.Query):
                    raise SqlglotError(f"not a query: {query[:40]}")
                columns = {s.alias_or_name: _sources(s.alias_or_name, tree, known) for s in tree.selects}
            except SqlglotError:
                out[table] = None
                continue
            out[table] = columns
            known.setdefault(table, dict.fromkeys(columns, "STRING"))  # the first writer's columns win
    return out


@functools.lru_cache(maxsize=1024)  # each root table's DDL, parsed once (the page asks every second)
def ddl_columns(ddl: str) -> tuple[tuple[str, str], ...]:
    """``(column, type)`` pairs of a column list such as ``\\`a\\` BIGINT, \\`b\\` DOUBLE`` (a root
    table's DDL, as the coordinator keeps it); empty if it does not parse.

    >>> ddl_columns("`a` BIGINT, `b` DOUBLE")
    (('a', 'BIGINT'), ('b', 'DOUBLE'))
    """
    try:
        tree = sqlglot.parse_one(f"CREATE TABLE t ({ddl})", read=SPARK)
    except SqlglotError:
        return ()
    return tuple((c.name, c.args["kind"].sql(dialect=SPARK).upper())
                 for c in tree.find_all(exp.ColumnDef) if c.args.get("kind") is not None)


def _reads(query: str) -> set[str]:
    try:
        return {t.name for t in sqlglot.parse_one(query, read=SPARK).find_all(exp.Table)}
    except SqlglotError:
        return set()


def _sources(column: str, query: exp.Query, schema: dict[str, dict[str, str]]) -> list[str]:
    node = lineage(column, query, schema=schema, dialect=SPARK)
    found = {f"{leaf.expression.name}.{leaf.name.rsplit('.', 1)[-1].strip(chr(34))}"
             for leaf in node.walk() if not leaf.downstream and isinstance(leaf.expression, exp.Table)}
    return sorted(found)
