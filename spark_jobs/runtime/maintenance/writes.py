"""Committing a barrier's change rows to the table, or a whole result.

Netted change rows are applied in one commit: appended (an append-only result), folded into
the old rows and the small table rewritten whole in one Spark job, or MERGEd by key into a
large table (which reads and rewrites only the files the changed keys may be in); a changelog
table's changed groups are appended (``append_groups``). Each way reads what it needs first
(the table's size and its rows before), computes, and hands the table one ``commits.Write``.
A rewrite grows with the table: a 10M-row join result took 11 s a barrier rewritten, 3.2 s MERGEd
(measured at c34c322; docs/performance.md has today's figures).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from coordinator.domain.snapshot import APPENDED, HIDDEN, ROW_KEY
from coordinator.domain.work import BarrierWork
from spark_jobs.planning.plan import WEIGHT, PlanKind, output_key
from spark_jobs.runtime.commits import Write
from spark_jobs.runtime.delta_log import COMPACTED, read_version, table_bytes
from spark_jobs.runtime.maintenance.aggregates import folded_groups, with_groups_recomputed
from spark_jobs.runtime.maintenance.change_rows import change_rows
from spark_jobs.runtime.maintenance.table import MaintainedTable, same_values
from spark_jobs.runtime.pruning import KEYS_LIMIT, within

DELETE = f"{HIDDEN}delete"
FILE_ROWS = 500_000  # rows per file of a whole write in key order (``key_ordered``)
BROADCAST_KEYS = 1_000_000  # a compaction's changed keys, up to this many, are probed rather than sorted

Written = tuple[int, tuple[int, int, int]]  # the table's version, and rows (in, out, rejected)


def write_result(t: MaintainedTable, work: BarrierWork, result: Callable[[], DataFrame], mode: str) -> Written:
    """Commit the rows ``result`` makes (in the barrier's plan phase), appended, or overwriting
    the table (in key order, its schema replaced): one Spark job, which counts them on the way."""
    with t.watch.phase("plan"):
        frame = result()
        t.known(frame.schema)
        observation = Observation()
        counted = frame.observe(observation, F.count(F.lit(1)).alias("rows"))
    if mode == "overwrite":
        version = t.commit(work, key_ordered(t, counted, {"overwriteSchema": "true"}))
    else:
        version = t.commit(work, Write("append", counted))
    rows = int(observation.get["rows"]) if t.sink.written else 0
    return version, (rows, rows, 0)


def upsert_groups(t: MaintainedTable, work: BarrierWork, groups: DataFrame, old_sink: int) -> Written:
    """Commit a keyed aggregate's changed ``groups`` (their new rows) over the table at
    ``old_sink``, the cheaper of two ways: the table rewritten whole in one Spark job (its other
    groups and these), or a MERGE by key. Groups changed across the whole key range make the
    MERGE read and rewrite every file, in more jobs than the rewrite runs (Nexmark's q17 at 10M
    events: 4.5 s a barrier, against 1.5 s rewritten). Changes near each other (new keys) make
    the MERGE cheap where it can skip files. A small table is rewritten; else ``t.costs``
    measures both ways (the overwrite that built the table is a rewrite's measure) and takes
    the cheaper, trying the other again now and then. A barrier that changed no group commits
    an empty append: every barrier of a keyed table commits, so a restart never stages again
    rows its state already holds."""
    with t.watch.phase("changes"):
        t.known(groups.schema)
        key = t.key
        groups = t.cache(groups)
        changed = groups.count()  # the write reads them from the cache
        rewrite = changed > 0 and (table_bytes(t.spark, t.sink.path) <= t.rewrite_limit_bytes or t.costs.whole())
        target = within(groups.select(*key).collect(), [(f"t.`{k}`", k) for k in key]) \
            if 0 < changed <= KEYS_LIMIT and not rewrite else None

    if rewrite:
        old = read_version(t.spark, t.sink.path, old_sink)
        write = whole_write(t, rows_but(old, groups.select(*key)).unionByName(groups))
    elif changed:
        write = Write("merge", groups, key=key, columns=t.columns, target=target)
    else:
        write = Write("append", groups)
    began = time.monotonic()
    version = t.commit(work, write)
    if changed:
        t.costs.measured(rewrite, time.monotonic() - began)
    return version, (changed, changed, 0)


def append_groups(t: MaintainedTable, work: BarrierWork, groups: DataFrame, old_sink: int) -> Written:
    """Commit a changelog table's changed ``groups`` (their new rows, each with its ``ROW_KEY``,
    ``BARRIER`` and ``APPENDED``) over the table at ``old_sink``: appended, which reads none of
    the table; or, when ``t.costs`` says compaction is due, the table rewritten whole with one
    row a key (its readers' view of it, these groups in place of theirs), only these appended:
    the tables that read it find the barrier's changes in either commit (``changelog_changes``)."""
    with t.watch.phase("changes"):
        t.known(groups.schema)
        groups = t.cache(groups)
        changed = groups.count()  # the write reads them from the cache
        compact = changed > 0 and t.costs.compact_due(table_bytes(t.spark, t.sink.path))
        if changed:
            t.costs.laid_out(compact)  # (kept with the commit)

    if compact:
        old = read_version(t.spark, t.sink.path, old_sink)
        whole = rows_but(old, groups.select(ROW_KEY), broadcast=changed <= BROADCAST_KEYS)
        write = whole_write(t, whole.withColumn(APPENDED, F.lit(False)).unionByName(groups))
    else:
        write = Write("append", groups)
    version = t.commit(work, write, COMPACTED if compact else None)
    if compact:
        t.costs.laid_out(True, table_bytes(t.spark, t.sink.path))
    return version, (changed, changed, 0)


def apply_changes(t: MaintainedTable, work: BarrierWork, base: tuple[dict[str, int], int],
                  net: DataFrame | None = None) -> Written:
    """Turn the sources' changes since ``base`` into weighted change rows (or take ``net``,
    netted already) and apply them: a small table is rewritten whole in one Spark job (old
    rows with the changes folded in); a large one gets a MERGE of just the changed rows."""
    old_versions, old_sink = base
    try:
        with t.watch.phase("plan"):
            # a small table (or an aggregate's one row) is rewritten from its rows before
            old = None if t.plan.key is None else before(t, old_sink, small=t.plan.one_row)
            if net is None:
                rows = change_rows(t, old_versions, work.source_versions, old_sink)
                # nothing is ever retracted where every change row is an insert (weight +1)
                net = rows if t.plan.inserts_only else netted(rows)
            if t.plan.kind == PlanKind.GROUPS:
                net = t.cache(net)  # read three times (upserts, retractions, gone keys): compute it once
            observation = Observation()
            write: Write | None
            if t.plan.key is None:  # an append-only result: add the new rows
                write = Write("append", appended_rows(t, net).observe(observation, F.count(F.lit(1)).alias("changed")))
            elif old is not None:
                write = whole_write(t, rewritten(t, net, old, work, observation))
            else:
                write = None
        if write is None:
            return merged(t, net, old_sink, work)
        version = t.commit(work, write)
        changed = int(observation.get["changed"]) if t.sink.written else 0
        return version, (changed, changed, 0)
    finally:
        t.release()  # (after a commit: nothing left; without one, what this barrier cached)


def merged(t: MaintainedTable, net: DataFrame, old_sink: int, work: BarrierWork) -> Written:
    """MERGE the changed rows (upserts and deletes by key) into a large table."""
    key = t.key
    with t.watch.phase("changes"):
        if t.plan.aggregated:  # (groups that lost their MIN/MAX are recomputed here: an action)
            old = read_version(t.spark, t.sink.path, old_sink)
            new = t.cache(folded_groups(t, net, old, whole=False))
            rows = with_groups_recomputed(t, new.where(F.col("_alive")), work).drop("_changed") \
                .withColumn(DELETE, F.lit(False))
            changes = rows.unionByName(deletes(t, new.where(~F.col("_alive")), key))
        else:
            changes = merge_rows_by_key(t, net)
        changes = t.cache(changes)
        changed = changes.count()  # computes the change once; the MERGE reads it from the cache
        # few changed keys: the MERGE opens only the files whose key ranges may hold them
        target = within(changes.select(*key).collect(), [(f"t.`{k}`", k) for k in key]) \
            if 0 < changed <= KEYS_LIMIT else None
    if not changed:
        return old_sink, (0, 0, 0)
    version = t.commit(work, Write("merge", changes, key=key, columns=t.columns, delete_flag=DELETE, target=target))
    return version, (changed, changed, 0)


def before(t: MaintainedTable, old_sink: int, small: bool = False) -> DataFrame | None:
    """The table's rows at version ``old_sink``, if it is ``small`` or up to ``rewrite_limit_bytes``
    (rewritten whole: one Spark job); None for a larger one (MERGEd)."""
    if not small and table_bytes(t.spark, t.sink.path) > t.rewrite_limit_bytes:
        return None
    return read_version(t.spark, t.sink.path, old_sink)


def netted(rows: DataFrame) -> DataFrame:
    """Change rows with equal values summed: those whose weights cancel are gone."""
    value_columns = [c for c in rows.columns if c != WEIGHT]
    return rows.groupBy(*value_columns).agg(F.sum(WEIGHT).alias(WEIGHT)).where(F.col(WEIGHT) != 0)


def rows_but(old: DataFrame, keys: DataFrame, broadcast: bool = False) -> DataFrame:
    """The table's rows ``old`` but those of ``keys`` (its key columns); ``broadcast``: few
    keys, probed rather than sorted with the table (Spark's static plan estimates them as large
    as what they were read from)."""
    few = F.broadcast(keys) if broadcast else keys
    return old.join(few, same_values(old, few, [(k, k) for k in keys.columns]), "left_anti")


def whole_write(t: MaintainedTable, whole: DataFrame) -> Write:
    """Overwriting the table with ``whole`` in key order, its shuffles in one task each (a small
    table into one file; a keyed aggregate's large one measured no faster in two)."""
    return key_ordered(t, whole)._replace(one_task=True)


def key_ordered(t: MaintainedTable, frame: DataFrame, options: dict[str, str] | None = None) -> Write:
    """A whole write of a table kept by key (writer ``options`` besides): in key order in files of
    at most ``FILE_ROWS`` rows, so each file holds a narrow range of keys and a later MERGE of a
    few keys rewrites only the files whose ranges hold them (``pruning``) instead of every file."""
    key = output_key(t.plan, [c for c in frame.columns if not c.startswith(HIDDEN)])
    if not t.plan.incremental or not key or "" in key:
        return Write("overwrite", frame, options or {})
    return Write("overwrite", frame.sortWithinPartitions(*key), {**(options or {}), "maxRecordsPerFile": str(FILE_ROWS)})


def deletes(t: MaintainedTable, keys: DataFrame, key: list[str]) -> DataFrame:
    """Merge rows that delete ``keys``: the key, typed NULLs elsewhere, and the delete flag."""
    assert t.schema is not None
    return keys.select(*[F.col(f.name) if f.name in key else F.lit(None).cast(f.dataType).alias(f.name)
                         for f in t.schema.fields]).withColumn(DELETE, F.lit(True))


def appended_rows(t: MaintainedTable, net: DataFrame) -> DataFrame:
    """An append-only result's new rows: each change row as often as its weight. Its inputs
    only grow, so a retraction means a source broke that promise: the write fails then."""
    if t.plan.inserts_only:
        return net.select(*t.columns)
    message = f"{t.table.name}: an append-only source retracted rows; run with a primary key"
    grown = net.where(F.assert_true(F.col(WEIGHT) > 0, message).isNull())
    return grown.withColumn("_n", F.explode(F.array_repeat(F.lit(1), F.col(WEIGHT).cast("int")))).select(*t.columns)


def upserts_and_gone(t: MaintainedTable, net: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Projection and join rows by key: the rows with positive weight win; keys with only a
    retraction are gone."""
    key = t.key
    upserts = net.where(F.col(WEIGHT) > 0).select(*t.columns)
    gone = net.where(F.col(WEIGHT) < 0).select(*key).distinct()
    return upserts, gone.join(upserts, same_values(gone, upserts, [(k, k) for k in key]), "left_anti")


def merge_rows_by_key(t: MaintainedTable, net: DataFrame) -> DataFrame:
    """MERGE rows of a projection or join: upserts, and deletes of the keys that are gone."""
    upserts, gone = upserts_and_gone(t, net)
    return upserts.withColumn(DELETE, F.lit(False)).unionByName(deletes(t, gone, t.key))


def rewritten(t: MaintainedTable, net: DataFrame, old: DataFrame, work: BarrierWork,
              observation: Observation) -> DataFrame:
    """The whole new table: its rows before (``old``) with the changes applied. ``observation``
    counts the changed rows."""
    if t.plan.aggregated:
        new = folded_groups(t, net, old, whole=True)
        result = with_groups_recomputed(t, new.where(F.col("_alive")), work)
    else:
        key = t.key
        upserts, gone = upserts_and_gone(t, net)
        kept = rows_but(old, upserts.select(*key).unionByName(gone))
        result = kept.withColumn("_changed", F.lit(False)).unionByName(upserts.withColumn("_changed", F.lit(True)))
    changed = F.coalesce(F.sum(F.col("_changed").cast("long")), F.lit(0))  # (no rows at all: 0)
    return result.observe(observation, changed.alias("changed")).drop("_changed")
