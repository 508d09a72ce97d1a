"""Column-level lineage of a pipeline file (``coordinator.columns`` over its tables and queries).

Example::

    >>> from spark_jobs.planning.pipeline import parse_pipeline
    >>> p = parse_pipeline("CREATE TABLE s (k BIGINT, v BIGINT) WITH ('source'='kafka:s');"
    ...                    "CREATE TABLE t AS SELECT k, SUM(v) * 2 AS total, COUNT(*) AS n FROM s GROUP BY k")
    >>> column_lineage(p)["t"]
    {'k': ['s.k'], 'total': ['s.v'], 'n': []}
"""

from __future__ import annotations

from coordinator.columns import column_sources
from spark_jobs.planning.pipeline import Pipeline


def column_lineage(pipeline: Pipeline) -> dict[str, dict[str, list[str]] | None]:
    """Per maintained table, output column -> its source columns (``table.column``, sorted; none
    for a constant or ``COUNT(*)``). None for a table whose query reads a table the pipeline
    does not declare (its columns are unknown here), and for a Python function's table."""
    schemas = tuple((t.name, tuple((c.name, c.type) for c in t.columns)) for t in pipeline.roots)
    found = column_sources(schemas, tuple((t.name, t.query) for t in pipeline.derived if t.python is None))
    return {t.name: None if t.python else found[t.name] for t in pipeline.derived}
