"""Column-level lineage of a pipeline, from its SQL alone (sqlglot's ``lineage``): for each
column of a maintained table, the columns of its sources it is computed from, so a user can
see what a change upstream reaches before running anything.

Example::

    >>> from spark_jobs.planning.pipeline import parse_pipeline
    >>> p = parse_pipeline("CREATE TABLE s (k BIGINT, v BIGINT) WITH ('source'='kafka:s');"
    ...                    "CREATE TABLE t AS SELECT k, SUM(v) * 2 AS total, COUNT(*) AS n FROM s GROUP BY k")
    >>> column_lineage(p)["t"]
    {'k': ['s.k'], 'total': ['s.v'], 'n': []}
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.lineage import lineage
from sqlglot.optimizer.qualify import qualify

from spark_jobs.planning.pipeline import Pipeline


def column_lineage(pipeline: Pipeline) -> dict[str, dict[str, list[str]] | None]:
    """Per maintained table, output column -> its source columns (``table.column``, sorted; none
    for a constant or ``COUNT(*)``). None for a table whose query reads a table the pipeline
    does not declare (its columns are unknown here)."""
    schema: dict[str, dict[str, str]] = {t.name: {c.name: c.type for c in t.columns} for t in pipeline.roots}
    out: dict[str, dict[str, list[str]] | None] = {}
    for table in pipeline.derived:
        try:
            query = qualify(sqlglot.parse_one(table.query, read="spark"), schema=schema, dialect="spark")
            columns = {select.alias_or_name: _sources(select.alias_or_name, query, schema) for select in query.selects}
        except SqlglotError:
            out[table.name] = None
            continue
        out[table.name] = columns
        schema.setdefault(table.name, dict.fromkeys(columns, "STRING"))  # INSERT INTO an undeclared table: first wins
    return out


def _sources(column: str, query: exp.Expression, schema: dict[str, dict[str, str]]) -> list[str]:
    node = lineage(column, query, schema=schema, dialect="spark")
    found = {f"{leaf.expression.name}.{leaf.name.rsplit('.', 1)[-1].strip(chr(34))}"
             for leaf in node.walk() if not leaf.downstream and isinstance(leaf.expression, exp.Table)}
    return sorted(found)
