"""An aggregate's groups after a barrier: the old groups folded with the change rows.

SUM/COUNT/AVG change by arithmetic on kept bookkeeping columns; MIN/MAX by comparison, unless
a retraction took away the extreme value; then, and for COUNT(DISTINCT), the group is
recomputed from the sources (``with_groups_recomputed``).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from coordinator.domain.snapshot import HIDDEN
from coordinator.domain.work import BarrierWork
from spark_jobs.planning.plan import ROWS, WEIGHT
from spark_jobs.runtime.maintenance.table import MaintainedTable, same_values


def folded_groups(t: MaintainedTable, net: DataFrame, old: DataFrame, whole: bool) -> DataFrame:
    """Aggregate values after the change: arithmetic on SUM/COUNT/AVG and on MIN/MAX that did
    not lose their extreme value. ``whole``: every group of the table, else only the changed
    ones; ``old``: the table's rows before. Columns ``_changed`` and ``_recompute`` (a MIN/MAX
    lost its extreme value, or a COUNT(DISTINCT) changed) say which groups
    ``with_groups_recomputed`` recomputes; ``_alive``, which keep a row: those with rows left,
    and the one row of an aggregate without GROUP BY always (``COUNT(*)`` 0, ``SUM`` NULL, as
    SQL answers over no rows)."""
    columns = t.columns
    shown = [c for c in columns if not c.startswith(HIDDEN)]
    key = t.key  # the GROUP BY columns
    groups = [f"{HIDDEN}g{i}" for i in range(len(key))]
    weight = F.col(WEIGHT)
    deltas = [F.sum(weight).alias("d_rows")]
    for i, agg in enumerate(t.plan.aggregates):
        arg = F.col(f"{HIDDEN}a{i}")
        if agg.func in ("sum", "avg", "count"):
            deltas.append(F.sum(F.when(arg.isNotNull(), weight).otherwise(0)).alias(f"d_nn{i}"))
        if agg.func in ("sum", "avg"):
            deltas.append(F.sum(arg * weight).alias(f"d_sum{i}"))
        elif agg.func in ("min", "max"):
            pick = F.min if agg.func == "min" else F.max
            deltas += [pick(F.when(weight > 0, arg)).alias(f"ins{i}"), pick(F.when(weight < 0, arg)).alias(f"ret{i}")]
    delta = net.groupBy(*groups).agg(*deltas)
    old = old.select(*[F.col(c).alias(f"o_{c}") for c in columns])
    on = same_values(delta, old, [(g, f"o_{k}") for g, k in zip(groups, key, strict=True)])
    joined = delta.join(old, on, "full_outer" if whole else "left")

    def d(name: str) -> Column:  # a group the barrier did not touch has no delta: 0
        return F.coalesce(F.col(name), F.lit(0))

    rows = F.coalesce(F.col(f"o_{ROWS}"), F.lit(0)) + d("d_rows")
    values: dict[str, Column] = {k: F.coalesce(F.col(g), F.col(f"o_{k}")) if whole else F.col(g)
                                 for k, g in zip(key, groups, strict=True)}
    values[ROWS] = rows
    recompute: Column = F.lit(False)
    for i, agg in enumerate(t.plan.aggregates):
        name = shown[agg.position]
        old_value = F.col(f"o_{name}")
        if agg.func in ("sum", "avg", "count"):
            nn = F.coalesce(F.col(f"o_{HIDDEN}nn{i}"), F.lit(0)) + d(f"d_nn{i}")
            if agg.func == "count":
                values[name] = F.coalesce(old_value, F.lit(0)) + d(f"d_nn{i}")
                continue
            values[f"{HIDDEN}nn{i}"] = nn
            if agg.func == "sum":
                values[name] = F.when(nn > 0, F.coalesce(old_value, F.lit(0)) + d(f"d_sum{i}"))
            else:
                total = F.coalesce(F.col(f"o_{HIDDEN}sum{i}"), F.lit(0)) + d(f"d_sum{i}")
                values[f"{HIDDEN}sum{i}"] = F.when(nn > 0, total)
                values[name] = F.when(nn > 0, total / nn)
        elif agg.func == "count_star":
            values[name] = rows
        elif agg.func in ("min", "max"):
            lost = F.col(f"ret{i}") <= old_value if agg.func == "min" else F.col(f"ret{i}") >= old_value
            recompute = recompute | (F.col(f"ret{i}").isNotNull() & old_value.isNotNull() & lost)
            values[name] = (F.least if agg.func == "min" else F.greatest)(old_value, F.col(f"ins{i}"))
        else:  # count_distinct: recomputed by with_groups_recomputed
            recompute = F.lit(True)
            values[name] = old_value
    changed = F.col("d_rows").isNotNull()
    assert t.schema is not None
    types = {f.name: f.dataType for f in t.schema.fields}
    return joined.select(*[values[c].cast(types[c]).alias(c) for c in columns],
                         (changed & recompute).alias("_recompute"), changed.alias("_changed"),
                         (F.lit(True) if t.plan.one_row else rows > 0).alias("_alive"))


def with_groups_recomputed(t: MaintainedTable, kept: DataFrame, work: BarrierWork) -> DataFrame:
    """``kept`` groups, with those marked ``_recompute`` computed again from the sources'
    snapshots at the barrier (only when MIN/MAX/COUNT(DISTINCT) may need it)."""
    columns = [*t.columns, "_changed"]
    funcs = {a.func for a in t.plan.aggregates}
    # new rows alone lose no extreme value, but they may bring a new distinct one
    if "count_distinct" not in funcs and (t.plan.inserts_only or not funcs & {"min", "max"}):
        return kept.select(*columns)
    kept = t.cache(kept)
    key = t.key
    redo = kept.where(F.col("_recompute")).select(*key)
    if not redo.limit(1).count():
        return kept.select(*columns)
    t.views(work.source_versions)
    fresh = t.spark.sql(t.plan.full_query)
    if key:  # (one global group: its one row)
        fresh = fresh.join(F.broadcast(redo), same_values(fresh, redo, [(k, k) for k in key]), "left_semi")
    return kept.where(~F.col("_recompute")).select(*columns).unionByName(
        fresh.select(*t.columns).withColumn("_changed", F.lit(True)))
