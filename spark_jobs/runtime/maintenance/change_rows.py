"""The sources' changes between two barriers as the table's weighted change rows, by shape.

* one source: its changes run through the query's FROM/WHERE/select list;
* a join of two tables: only the rows whose join key changed, from both sides' snapshots at the
  old versions (weight -1) and the new ones (+1); the rest of each side is never copied;
* INNER joins of more tables: the delta rule, one term per changed table;
* UNION ALL: each branch's change rows;
* by group: the query over the source rows of the groups the changes touch at the new version
  (+1), and the table's old rows of those groups (-1).
"""

from __future__ import annotations

import functools

from pyspark.sql import Column, DataFrame, Row, Window
from pyspark.sql import functions as F
from pyspark.sql.types import MapType

from coordinator.domain.snapshot import HIDDEN
from spark_jobs.planning.groups import GroupValue, group_value
from spark_jobs.planning.plan import NUMBER, WEIGHT, Plan, PlanKind
from spark_jobs.runtime.delta_log import read_version
from spark_jobs.runtime.maintenance.table import MaintainedTable, keys_to_join, narrowed, same_values


def change_rows(t: MaintainedTable, old: dict[str, int], new: dict[str, int], old_sink: int,
                plan: Plan | None = None) -> DataFrame:
    """The change rows of ``plan`` (default: the table's) from source versions ``old`` to ``new``."""
    plan = plan or t.plan
    if plan.kind == PlanKind.UNION:  # each branch's change rows, by position, named as the first branch's
        frames = [change_rows(t, old, new, old_sink, b) for b in plan.branches
                  if any(old[s] != new[s] for s in b.sources)]
        return functools.reduce(DataFrame.union, frames).toDF(*frames[0].columns)
    if plan.kind == PlanKind.GROUPS:
        return group_change_rows(t, old, new, old_sink)
    if len(plan.sources) > 2:
        return delta_rule(t, old, new, plan)
    if not plan.join_columns:
        (source,) = plan.sources
        t.views({}, {source: (old[source], new[source])})
        return t.spark.sql(plan.change_query)
    return join_change_rows(t, old, new, plan)


def join_change_rows(t: MaintainedTable, old: dict[str, int], new: dict[str, int], plan: Plan) -> DataFrame:
    """A join of two tables: its rows whose join key changed, before (-1) and after (+1)."""
    left, right = plan.join_columns  # FROM table first
    keys = [f"{HIDDEN}k{i}" for i in range(len(plan.join_columns[left]))]
    pairs = {s: list(zip(plan.join_columns[s], keys, strict=True)) for s in (left, right)}
    changes = t.frames({}, {s: (old[s], new[s]) for s in (left, right) if old[s] != new[s]})
    touched = [changes[s].select(*[F.col(c).alias(k) for c, k in pairs[s]]) for s in changes]
    changed_keys, found = keys_to_join(functools.reduce(DataFrame.unionByName, touched).distinct())

    def side(table: str, version: int, weight: int) -> DataFrame:
        frame = narrowed(t.snapshot(table, version), found, pairs[table])
        near = frame.join(changed_keys, same_values(frame, changed_keys, pairs[table]), "left_semi")
        return near.withColumn(WEIGHT, F.lit(weight))

    t.bind({left: side(left, old[left], -1), right: side(right, old[right], 1)})
    before = t.spark.sql(plan.change_query)
    t.bind({left: side(left, new[left], 1), right: side(right, new[right], 1)})
    after = t.spark.sql(plan.change_query)
    return before.unionByName(after)


def delta_rule(t: MaintainedTable, old: dict[str, int], new: dict[str, int], plan: Plan) -> DataFrame:
    """INNER joins of three or more tables: new(A⋈B⋈C) - old(A⋈B⋈C) is the sum over the changed
    tables T of T's change rows (weight ±1) joined with the tables before T at their new
    version and those after T at their old one. Each term reads one table's changes, which
    are broadcast, so the other tables are scanned but never shuffled whole."""
    terms: list[DataFrame] = []
    for i, table in enumerate(plan.sources):
        if old[table] == new[table]:
            continue
        t.views({s: new[s] if j < i else old[s] for j, s in enumerate(plan.sources) if s != table},
                {table: (old[table], new[table])}, weighted=True)
        terms.append(t.spark.sql(plan.change_query))
    return functools.reduce(DataFrame.unionByName, terms)


def group_change_rows(t: MaintainedTable, old: dict[str, int], new: dict[str, int], old_sink: int) -> DataFrame:
    """The groups shape: the rows of the groups the sources' changes touch, recomputed from
    the sources' rows of those groups (+1), and the table's old rows of those groups (-1).
    A few touched groups also filter every read (``pruning``): only files that may hold
    them are opened."""
    plan = t.plan
    names = list(plan.group_columns)
    values = {s: [group_value(c) for c in columns] for s, columns in plan.group_sources.items()}
    changes = t.frames({}, {s: (old[s], new[s]) for s in values if old[s] != new[s]})
    changed = [changes[s].select(*[group_of(v).alias(n) for v, n in zip(values[s], names, strict=True)])
               for s in changes]
    for table, query in plan.reach.items():  # LEFT joins: the groups that reach the table's changed rows
        if old[table] != new[table]:
            t.views({s: new[s] for s in plan.sources if s != table}, {table: (old[table], new[table])})
            changed.append(t.spark.sql(query).toDF(*names))
    touched, found = keys_to_join(functools.reduce(DataFrame.unionByName, changed).distinct())
    frames = t.frames({s: new[s] for s in [*plan.reach, *values]})  # (those of plan.reach read whole)
    for table, held in values.items():
        frames[table] = rows_of_groups(frames[table], held, names, touched, found)
    t.bind(frames)
    fresh = numbered(t, t.spark.sql(plan.query))
    pairs = [(n, n) for n in names]
    table_rows = narrowed(read_version(t.spark, t.sink.path, old_sink), found, pairs)
    before = table_rows.join(touched, same_values(table_rows, touched, pairs), "left_semi").select(*fresh.columns)
    return fresh.withColumn(WEIGHT, F.lit(1)).unionByName(before.withColumn(WEIGHT, F.lit(-1)))


def group_of(value: GroupValue) -> Column:
    """A source row's group value (a time window: the window, several rows when it slides)."""
    return F.col(value.column) if value.column else F.expr(value.expression)


def rows_of_groups(rows: DataFrame, held: list[GroupValue], names: list[str], touched: DataFrame,
                   found: list[Row] | None) -> DataFrame:
    """The source ``rows`` of the ``touched`` groups (columns ``names``), which each row holds
    as ``held``: equal values, or a time within a touched window. ``found`` (the touched
    groups, when few) narrows the read to their value and time ranges first."""
    rows = narrowed(rows, found, [(v.column, n) for v, n in zip(held, names, strict=True) if v.column])
    tests: list[Column] = []
    extra: list[str] = []
    for i, (value, name) in enumerate(zip(held, names, strict=True)):
        if value.column:
            tests.append(rows[value.column].eqNullSafe(touched[name]))
            continue
        extra.append(f"{HIDDEN}v{i}")
        if value.time is None:
            rows = rows.withColumn(extra[-1], F.expr(value.expression))
            tests.append(rows[extra[-1]].eqNullSafe(touched[name]))
            continue
        rows = rows.withColumn(extra[-1], F.expr(value.time))
        time, window = rows[extra[-1]], touched[name]
        tests.append((time >= window["start"]) & (time < window["end"]) | time.isNull() & window.isNull())
        windows = [r[name] for r in found or [] if r[name] is not None]
        if windows:  # rows are written in about time order: skip the files of other times
            rows = rows.where(time.isNull() | time.between(min(w["start"] for w in windows),
                                                            max(w["end"] for w in windows)))
    near = rows.join(touched, functools.reduce(lambda a, b: a & b, tests), "left_semi")
    return near.drop(*extra)


def numbered(t: MaintainedTable, result: DataFrame) -> DataFrame:
    """The query's rows with their number within their group, where that number is part of
    the key (``NUMBER``): ordered by every column, so equal groups number equal rows alike."""
    if t.plan.kind != PlanKind.GROUPS or NUMBER not in (t.plan.key or ()):
        return result
    order = [F.to_json(result[f.name]) if isinstance(f.dataType, MapType) else result[f.name]
             for f in result.schema.fields]  # (maps have no order)
    group = Window.partitionBy(*[result[c] for c in t.plan.group_columns]).orderBy(*order)
    return result.withColumn(NUMBER, F.row_number().over(group))
