"""Python tables (``spark_jobs.planning.python_tables``): a user's function of DataFrames.

If Spark's plan of the function over one source is row-wise (``row_wise``), the table follows
the source's changes: over a source that only grows, the function over its new rows,
appended; over a keyed source, the function over the new images of its changed rows,
replacing the rows of the keys they change (a key whose row is gone or filtered out is
deleted). Rows the function raises on go to the table's dead letters (``<table>__dlq``), also
when a function of one source is recomputed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from coordinator.domain.errors import LockstepError
from coordinator.domain.events import dead_letters
from coordinator.domain.work import BarrierWork
from spark_jobs.planning.plan import WEIGHT, PlanKind
from spark_jobs.planning.python_tables import SESSION
from spark_jobs.runtime.commits import DeltaSink, Write
from spark_jobs.runtime.delta_log import read_version
from spark_jobs.runtime.maintenance.table import MaintainedTable, visible
from spark_jobs.runtime.maintenance.writes import Written, apply_changes, netted, write_result
from spark_jobs.runtime.row_wise import failing_rows, key_problem, python_error, row_wise_problem

log = logging.getLogger(__name__)
DEAD_LETTERS_PHASE = "dead_letters"  # the search for the rows a function raised on

FUNCTION_DLQ_SCHEMA = "row STRING, error STRING, barrier BIGINT"  # a Python table's input row (JSON) and its error


def call(t: MaintainedTable, frames: dict[str, DataFrame]) -> DataFrame:
    """A Python table's function over ``frames`` (source name -> its rows, without the
    bookkeeping columns readers never see), and the session if it asks."""
    python = t.table.python
    assert python is not None
    arguments: dict[str, object] = {name: visible(frame) for name, frame in frames.items()}
    if python.wants_session:
        arguments[SESSION] = t.spark
    result = python.function(**arguments)
    if not isinstance(result, DataFrame):
        raise LockstepError(f"{python.origin}: {python.function.__name__} returned a {type(result).__name__}, "
                            "not a DataFrame; return the DataFrame of the table's rows")
    return result


def recompute_function(t: MaintainedTable, work: BarrierWork) -> Written:
    """The function over the sources' snapshots at the barrier, overwriting the table; over one
    source, without the rows it raises on (to the dead letters)."""
    frames = t.snapshots(work)
    if len(frames) > 1:  # no one input to find the rows it raises on in
        return write_result(t, work, lambda: call(t, frames), "overwrite")
    ((source, rows),) = frames.items()
    return without_failing_rows(
        t, work, source, rows, lambda good: write_result(t, work, lambda: call(t, {source: good}), "overwrite"),
        whole=True)


def check_row_wise(t: MaintainedTable, work: BarrierWork) -> None:
    """Keep a ROW_WISE plan only for a function that is row-wise (its analyzed plan, no action);
    else the table is recomputed at every barrier, and the log says why."""
    result = call(t, t.snapshots(work))
    problem = row_wise_problem(result)
    if problem is None and t.plan.key is not None:
        problem = key_problem(result, t.plan.sources[0], [str(k) for k in t.plan.key])
    if problem is not None:
        t.plan = replace(t.plan, kind=PlanKind.FULL_REFRESH, reason=problem, key=None, append_only=False,
                         inserts_only=False)
        log.warning("table %s: recomputed at every barrier, not from its source's changed rows: %s",
                    t.table.name, problem)


def follow_row_wise(t: MaintainedTable, work: BarrierWork, base: tuple[dict[str, int], int] | None) -> Written:
    """A row-wise function's table: the function over its source's changed rows since ``base``
    (new rows appended, or a keyed source's rows replaced: ``replace_changed_keys``); with no
    base, or a source that only grows but changed rows after all, over all its rows, replacing
    the table. Rows it raises on go to the dead letters with the error, and the rest is committed."""
    (source,) = t.plan.sources
    new = work.source_versions[source]
    if base is not None and t.plan.key is not None:
        return replace_changed_keys(t, work, base)
    found = None if base is None else t.added(source, base[0][source], new)
    rows = None if found is None else found[0]
    if base is not None and rows is None:
        log.warning("table %s: %s changed or removed rows by barrier %d (a table that only grows should not): "
                    "recomputed from all its rows", t.table.name, source, work.barrier)
    mode = "overwrite" if rows is None else "append"
    return without_failing_rows(t, work, source, t.snapshot(source, new) if rows is None else rows,
                                lambda good: write_result(t, work, lambda: call(t, {source: good}), mode),
                                whole=rows is None)


def replace_changed_keys(t: MaintainedTable, work: BarrierWork, base: tuple[dict[str, int], int]) -> Written:
    """A row-wise function over a keyed source: the function over the new images of the rows
    that changed since ``base``, replacing the table's rows of their keys (``apply_changes``: a
    MERGE, or a rewrite of a small table). A key whose row is gone, or whose new row the
    function filters out or raises on, loses its row."""
    (source,) = t.plan.sources
    changed = t.changes(source, base[0][source], work.source_versions[source])
    net = t.cache(netted(changed))
    key = {str(k).lower() for k in t.plan.key or ()}  # (the function may spell them otherwise: OID)

    def replace_keys(rows: DataFrame) -> Written:
        result = call(t, {source: rows})
        t.known(result.schema)
        # (aliased: the same attributes as the result's key, which would make joining them a self-join)
        touched = net.select(*[F.col(f.name).alias(f.name) if f.name.lower() in key
                               else F.lit(None).cast(f.dataType).alias(f.name) for f in result.schema.fields]).distinct()
        return apply_changes(t, work, base, result.withColumn(WEIGHT, F.lit(1))
                             .unionByName(touched.withColumn(WEIGHT, F.lit(-1))))

    return without_failing_rows(t, work, source, net.where(F.col(WEIGHT) > 0).drop(WEIGHT), replace_keys)


def without_failing_rows(t: MaintainedTable, work: BarrierWork, source: str, rows: DataFrame,
                         attempt: Callable[[DataFrame], Written], whole: bool = False) -> Written:
    """``attempt`` with the function over ``rows`` of ``source`` (``whole``: all its rows);
    if the function raises on some of them, ``attempt`` again without those, which go to the
    dead letters with the error. A function that fails on no row alone fails the barrier, as
    any other error."""
    rows = visible(rows)  # (the dead letters hold what the function was given)
    try:
        return attempt(rows)
    except Exception as exc:
        if python_error(exc) is None:
            raise
        failure = exc
    with t.watch.phase(DEAD_LETTERS_PHASE):
        good, letters = failing_rows(rows, lambda part: call(t, {source: part}))
        if not letters:
            raise failure
        keep_dead_letters(t, letters, work, whole)
    return attempt(good)


def keep_dead_letters(t: MaintainedTable, letters: list[tuple[str, str]], work: BarrierWork, whole: bool) -> None:
    """The input rows the function raised on, each with the error, in ``<table>__dlq`` (one
    commit per barrier with its txn mark, as the table's). ``whole``: the letters come from
    all the source's rows, so those an earlier barrier kept already are not kept again."""
    name = dead_letters(t.table.name)
    dlq = t.dlq = t.dlq or DeltaSink(t.spark, t.locate(name), dead_letters(t.job_id), FUNCTION_DLQ_SCHEMA,
                                     crash_at=t.crash_at, compact_every=t.compact_every, name=name,
                                     lazy_history=True, table_id=t.sink.table_id)
    if whole:
        kept = read_version(t.spark, dlq.path, None).where(F.col("row").isin([row for row, _ in letters]))
        known = {(r["row"], r["error"]) for r in kept.select("row", "error").collect()}
        letters = [letter for letter in letters if letter not in known]
    if not letters:
        return
    frame = t.spark.createDataFrame([(row, error, work.barrier) for row, error in letters], FUNCTION_DLQ_SCHEMA)
    dlq.commit(work.barrier, work.generation, Write("append", frame))
    log.warning("table %s: %d row(s) of barrier %d raised in its function, kept in %s: %s", t.table.name,
                len(letters), work.barrier, dead_letters(t.table.name), letters[0][1])
