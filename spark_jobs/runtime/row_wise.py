"""Whether a DataFrame is its one input's rows taken one at a time: what lets a Python table's
function run on each barrier's new rows only (``PlanKind.ROW_WISE``) and give the rows it would
give over the whole input.

Spark's analyzed plan says it: only projections, filters and generators (``explode``) over a
single relation, UDFs of every kind included (they sit in a projection's expressions). An
aggregate, join, window, sort, limit, distinct or sample needs other rows, and a subquery in an
expression reads another table.

Over a keyed source its result is kept by that key (each barrier replaces the rows of the keys
that changed), so the function must also give each input row at most one row and keep the key
columns as they are: ``key_problem`` says when it does not.

A function that raises on some rows (a UDF given a value it cannot take) fails the whole Spark
job; ``failing_rows`` finds those rows by halving the input, so the rest can be committed and
they go to the dead letters with the error.

Example::

    problem = row_wise_problem(clicks.where("ms > 200").select("page"))   # None: row-wise
    problem = key_problem(orders.select("oid", score("amount")), "orders", ("oid",))  # None: kept by oid
    good, bad = failing_rows(clicks, lambda rows: rows.select(score(F.col("ms"))))
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from coordinator.domain.errors import LockstepError

PYTHON_ERROR = "An exception was thrown from the Python worker"
ROW_ID = "__lockstep_row"
BAD_ROWS_LIMIT = 100  # more failing rows in one barrier than this: the function is wrong, not the rows

# (Repartition: rows moved between partitions, each as it is; a small read is one partition,
# ``delta_log.read_files``, and a function may repartition its input too)
ROW_WISE_NODES = frozenset({"Project", "Filter", "Generate", "SubqueryAlias", "Repartition"})
# Spark's loggers of a failed task and of the aborted (noop) write: each probe of the bad-row
# search that fails logs ERRORs with the Python traceback, tens per bad row, for failures that
# are expected
TASK_FAILURE_LOGGERS = ("org.apache.spark.executor.Executor", "org.apache.spark.scheduler.TaskSetManager",
                        "org.apache.spark.api.python.PythonRunner", "org.apache.spark.util.Utils",
                        "org.apache.spark.sql.execution.datasources.v2.OverwriteByExpressionExec",
                        "org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask")


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


def key_problem(frame: DataFrame, source: str, key: Sequence[str]) -> str | None:
    """Why ``frame``'s rows are not identified by its input's ``key`` columns, or None: a row-wise
    ``frame`` (``row_wise_problem``) that gives each input row at most one row and keeps the key
    columns unchanged (the same attributes in Spark's analyzed plan, not values computed anew)."""
    plan = frame._jdf.queryExecution().analyzed()
    nodes = _nodes(plan)
    columns = ", ".join(key)
    if any(n.nodeName() == "Generate" for n in nodes):
        return (f"it may give a row of {source} several rows (a generator such as explode), so {source}'s key "
                f"({columns}) does not identify its rows")
    (leaf,) = [n for n in nodes if n.children().isEmpty()]
    given = {a.name().lower(): a.exprId().id() for a in _seq(leaf.output())}  # (names as Spark compares them)
    kept = {a.name().lower(): a.exprId().id() for a in _seq(plan.output())}
    if any(kept.get(k.lower()) is None or kept.get(k.lower()) != given.get(k.lower()) for k in key):
        return (f"its result does not keep {source}'s key ({columns}) as it is: select the key column(s) "
                "unchanged to have each barrier replace just the rows of the keys that changed")
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


def python_error(error: BaseException) -> str | None:
    r"""The error a UDF raised in the Python worker, as its traceback's last line
    (``ValueError: ...``); None if ``error`` is another kind of failure.

    >>> python_error(RuntimeError(PYTHON_ERROR + ':\nTraceback (most recent call last):\n  File "x.py", line 3, in f\n'
    ...                           '    raise ValueError("no")\nValueError: no\n\tat org.apache.spark.Task.run'))
    'ValueError: no'
    """
    text = str(error)
    if PYTHON_ERROR not in text:
        return None
    lines = text[text.index(PYTHON_ERROR):].splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Traceback")), 0)
    return next((line for line in lines[start + 1:] if line.strip() and not line[0].isspace()), lines[-1]).strip()


@contextlib.contextmanager
def quiet_task_failures(spark: SparkSession) -> Iterator[None]:
    """Spark's task-failure logs off while probes are expected to fail (the driver's JVM: in local
    mode its executors' too); the failures that matter are raised and logged by the job."""
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j  # type: ignore[union-attr]
    levels = {name: log4j.LogManager.getLogger(name).getLevel() for name in TASK_FAILURE_LOGGERS}
    for name in levels:
        log4j.core.config.Configurator.setLevel(name, log4j.Level.OFF)
    try:
        yield
    finally:
        for name, level in levels.items():
            log4j.core.config.Configurator.setLevel(name, level)


def failing_rows(rows: DataFrame, apply: Callable[[DataFrame], DataFrame],
                 limit: int = BAD_ROWS_LIMIT) -> tuple[DataFrame, list[tuple[str, str]]]:
    """``rows`` without those ``apply`` raises on, and each of those as (its JSON, the error).
    Halves the input until each failing part is one row: about 2 log2(n) Spark jobs per bad row."""
    numbered = rows.withColumn(ROW_ID, F.monotonically_increasing_id()).localCheckpoint()  # numbers that stay
    ids = [r[0] for r in numbered.select(ROW_ID).orderBy(ROW_ID).collect()]
    bad: dict[int, str] = {}

    def part(lo: int, hi: int) -> DataFrame:
        return numbered.where(F.col(ROW_ID).between(ids[lo], ids[hi - 1])).drop(ROW_ID)

    def search(lo: int, hi: int) -> None:
        try:
            apply(part(lo, hi)).write.format("noop").mode("overwrite").save()
            return
        except Exception as exc:
            error = python_error(exc)
            if error is None:
                raise
            if hi - lo > 1:
                search(lo, (lo + hi) // 2)
                search((lo + hi) // 2, hi)
                return
            bad[ids[lo]] = error
            if len(bad) > limit:
                raise LockstepError(f"the function raised on more than {limit} rows of one barrier, e.g. {error}; "
                                    "fix it (its job restarts and tries the barrier again)") from exc

    if ids:
        with quiet_task_failures(rows.sparkSession):
            search(0, len(ids))
    letters = [(json.dumps({k: v for k, v in row.asDict().items() if k != ROW_ID}, default=str), bad[row[ROW_ID]])
               for row in numbered.where(F.col(ROW_ID).isin(list(bad))).collect()]
    return numbered.where(~F.col(ROW_ID).isin(list(bad))).drop(ROW_ID), letters
