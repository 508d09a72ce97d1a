"""Whether a DataFrame is its one input's rows taken one at a time: what lets a Python table's
function run on each barrier's new rows only (``PlanKind.ROW_WISE``) and give the rows it would
give over the whole input.

Spark's analyzed plan says it: only projections, filters and generators (``explode``) over a
single relation, UDFs of every kind included (they sit in a projection's expressions). An
aggregate, join, window, sort, limit, distinct or sample needs other rows, and a subquery in an
expression reads another table.

Example::

    problem = row_wise_problem(clicks.where("ms > 200").select("page"))   # None: row-wise
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame

ROW_WISE_NODES = frozenset({"Project", "Filter", "Generate", "SubqueryAlias"})


def _nodes(plan: Any) -> list[Any]:
    found, stack = [], [plan]
    while stack:
        node = stack.pop()
        found.append(node)
        children = node.children()
        stack.extend(children.apply(i) for i in range(children.size()))
    return found


def row_wise_problem(frame: DataFrame) -> str | None:
    """Why ``frame`` is not its one input's rows taken one at a time, or None if it is."""
    nodes = _nodes(frame._jdf.queryExecution().analyzed())
    leaves = [n for n in nodes if n.children().isEmpty()]
    others = sorted({n.nodeName() for n in nodes if not n.children().isEmpty()} - ROW_WISE_NODES)
    if others:
        return f"its result needs other rows than each input row alone ({', '.join(others)})"
    if len(leaves) != 1:
        return f"it reads {len(leaves)} inputs"
    if any("subquery" in str(e.prettyName()).lower() for n in nodes for e in _expressions(n)):
        return "an expression of it reads another table (a subquery)"
    return None


def _expressions(node: Any) -> list[Any]:
    found: list[Any] = []
    for expression in _seq(node.expressions()):
        stack = [expression]
        while stack:
            e = stack.pop()
            found.append(e)
            stack.extend(_seq(e.children()))
    return found


def _seq(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]
