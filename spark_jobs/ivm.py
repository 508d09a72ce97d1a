"""Maintaining intermediate tables at each barrier, incrementally where the plan allows.

For barrier ``b`` the job knows the source versions it reflected last (``base``) and the
sources' exact points at ``b``. It turns the sources' changes between the two into **change
rows with a weight** (+n inserted, -n retracted):

* one source: the Delta change data feed between the versions, run through the query's
  FROM/WHERE/select list;
* a join: only the rows whose join key changed, computed from both sides' snapshots at the
  old versions (weight -1) and the new ones (+1); the rest of each side is never copied.

Equal rows with opposite weights cancel. The rest is applied to the sink in one MERGE per
barrier: by key (projection, join), appended (append-only inputs), or folded into the groups
of an aggregate (SUM/COUNT/AVG by arithmetic on kept bookkeeping columns; MIN/MAX and
COUNT(DISTINCT) recompute just the groups that need it). Queries outside these shapes are
recomputed from the snapshots at ``b`` (full refresh). The first barrier a job processes is
always computed from the snapshots.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from coordinator.stream.coordinator import now_ms
from spark_jobs.commits import CompletionPublisher, DeltaSink, merge_by_key
from spark_jobs.epochs import BarrierWork
from spark_jobs.pipeline import DerivedTable
from spark_jobs.plans import HIDDEN, ROWS, WEIGHT, Plan, output_key

DELETE = f"{HIDDEN}delete"
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def _same(left: DataFrame, right: DataFrame, pairs: list[tuple[str, str]]) -> Column:
    """Null-safe equality of column pairs: GROUP BY and join keys may be NULL."""
    return functools.reduce(lambda a, b: a & b, [left[x].eqNullSafe(right[y]) for x, y in pairs])


@dataclass
class TableMaintainer:
    """Runs one derived table's job: ``process(work)`` for every barrier, in order."""

    spark: SparkSession
    table: DerivedTable
    plan: Plan
    job_id: str
    warehouse: Path
    publisher: CompletionPublisher

    def __post_init__(self) -> None:
        # The table is created by its first barrier's write (CREATE TABLE AS SELECT is atomic).
        self.sink = DeltaSink(self.spark, self._path(self.table.name), self.job_id, None, create_on_first_write=True)
        self.schema: StructType | None = None
        if self.sink.exists:
            self.schema = self.spark.read.format("delta").load(self.sink.path).schema
        # generation, the source versions reflected, and the sink version
        self.base: tuple[int, dict[str, int], int] | None = None
        self.query_id = hashlib.sha256(self.table.query.encode()).hexdigest()[:16]
        self._cached: list[DataFrame] = []

    # -- reading sources ------------------------------------------------------------------------

    def _path(self, table: str) -> str:
        return str(self.warehouse / table)

    def snapshot(self, table: str, version: int) -> DataFrame:
        return self.spark.read.format("delta").option("versionAsOf", version).load(self._path(table))

    def changes(self, table: str, old: int, new: int) -> DataFrame:
        """Rows of ``table`` changed in versions ``(old, new]`` with a weight of +1 or -1."""
        feed = (self.spark.read.format("delta").option("readChangeFeed", "true")
                .option("startingVersion", old + 1).option("endingVersion", new).load(self._path(table)))
        sign = F.when(F.col("_change_type").isin("insert", "update_postimage"), 1).otherwise(-1)
        return feed.withColumn(WEIGHT, sign).drop(*CDF_COLUMNS)

    def _bind_snapshots(self, work: BarrierWork) -> None:
        """Bind each source to its exact-point version for the barrier."""
        self._bind({s: self.snapshot(s, v) for s, v in work.source_versions.items()})

    def _bind(self, frames: dict[str, DataFrame]) -> None:
        """Name each source in this job's own session (temp views), for the query to read."""
        for name, frame in frames.items():
            frame.createOrReplaceTempView(name)

    # -- the barrier loop -----------------------------------------------------------------------

    def process(self, work: BarrierWork) -> None:
        started = now_ms()
        sources = dict(work.source_versions)
        done = self.sink.versions.get((work.generation, work.barrier))
        counts = (0, 0, 0)
        if done is not None:  # committed before a restart: only the completion may be missing
            version = done
        else:
            base = self._base(work)
            if base is not None and base[0] == sources:
                version = base[1]  # no source changed: same version as the barrier before
            elif base is None or not self.plan.incremental:
                version, counts = self._recompute(work)
            else:
                version, counts = self._apply(work, base)
        self.base = (work.generation, sources, version)
        self.publisher.publish(self.job_id, self.table.name, work.barrier, work.generation, version, started,
                               counts, source_versions=sources)

    def _base(self, work: BarrierWork) -> tuple[dict[str, int], int] | None:
        """What the table reflects before ``work``: None (recompute) in a new generation (a
        revision) or when the job's query changed since the table's last commit."""
        if self.base is not None and self.base[0] == work.generation:
            return self.base[1], self.base[2]
        last = self.sink.last_commit(work.generation, work.barrier)
        if last is None or self.sink.queries.get((work.generation, last[0]), self.query_id) != self.query_id:
            return None
        sources = self.sink.sources.get((work.generation, last[0]))
        return None if sources is None else (sources, last[1])

    def _recompute(self, work: BarrierWork) -> tuple[int, tuple[int, int, int]]:
        """Compute the whole table from the sources' snapshots at the barrier and overwrite it."""
        self._bind_snapshots(work)
        result = self.spark.sql(self.plan.full_query or self.plan.query).cache()  # counted and written once
        try:
            sink = self.sink
            self.schema = result.schema
            rows = result.count()
            version = sink.commit(
                work.barrier, work.generation,
                lambda: result.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(sink.path),
                work.source_versions, self.query_id,
            )
        finally:
            result.unpersist()
        return version, (rows, rows, 0)

    def _apply(self, work: BarrierWork, base: tuple[dict[str, int], int]) -> tuple[int, tuple[int, int, int]]:
        """Turn the sources' changes into weighted change rows and MERGE them into the sink."""
        old_versions, old_sink = base
        rows = self._change_rows(old_versions, work.source_versions)
        value_columns = [c for c in rows.columns if c != WEIGHT]
        net = rows.groupBy(*value_columns).agg(F.sum(WEIGHT).alias(WEIGHT)).where(F.col(WEIGHT) != 0)
        try:
            merge_rows = self._keep(self._fold_groups(net, old_sink, work) if self.plan.aggregates else self._by_key(net))
            changed = merge_rows.count()  # computes the change once; the MERGE reads it from the cache
            if not changed:
                return old_sink, (0, 0, 0)
            version = self.sink.commit(work.barrier, work.generation, lambda: self._merge(merge_rows),
                                       work.source_versions, self.query_id)
            return version, (changed, changed, 0)
        finally:
            for frame in self._cached:
                frame.unpersist()
            self._cached.clear()

    def _keep(self, frame: DataFrame) -> DataFrame:
        """Cache a frame used more than once in this barrier; released when the barrier is done."""
        self._cached.append(frame.cache())
        return frame

    # -- change rows ----------------------------------------------------------------------------

    def _change_rows(self, old: dict[str, int], new: dict[str, int]) -> DataFrame:
        if not self.plan.join_columns:
            (source,) = self.plan.sources
            self._bind({source: self.changes(source, old[source], new[source])})
            return self.spark.sql(self.plan.change_query)
        left, right = self.plan.join_columns  # FROM table first
        keys = [f"{HIDDEN}k{i}" for i in range(len(self.plan.join_columns[left]))]
        pairs = {t: list(zip(self.plan.join_columns[t], keys, strict=True)) for t in (left, right)}
        touched = [self.changes(t, old[t], new[t]).select(*[F.col(c).alias(k) for c, k in pairs[t]])
                   for t in (left, right) if old[t] != new[t]]
        changed_keys = F.broadcast(functools.reduce(DataFrame.unionByName, touched).distinct())

        def side(table: str, version: int, weight: int) -> DataFrame:
            frame = self.snapshot(table, version)
            near = frame.join(changed_keys, _same(frame, changed_keys, pairs[table]), "left_semi")
            return near.withColumn(WEIGHT, F.lit(weight))

        self._bind({left: side(left, old[left], -1), right: side(right, old[right], 1)})
        before = self.spark.sql(self.plan.change_query)
        self._bind({left: side(left, new[left], 1), right: side(right, new[right], 1)})
        after = self.spark.sql(self.plan.change_query)
        return before.unionByName(after)

    # -- applying them ---------------------------------------------------------------------------

    def _columns(self) -> list[str]:
        assert self.schema is not None
        return [f.name for f in self.schema.fields]

    def _deletes(self, keys: DataFrame, key: list[str]) -> DataFrame:
        """Merge rows that delete ``keys``: the key, typed NULLs elsewhere, and the delete flag."""
        assert self.schema is not None
        return keys.select(*[F.col(f.name) if f.name in key else F.lit(None).cast(f.dataType).alias(f.name)
                             for f in self.schema.fields]).withColumn(DELETE, F.lit(True))

    def _key(self) -> list[str]:
        key = output_key(self.plan, [c for c in self._columns() if not c.startswith(HIDDEN)])
        assert key is not None
        return list(key)

    def _by_key(self, net: DataFrame) -> DataFrame:
        """Projection and join rows: per key, the row with positive weight wins; keys with only a
        retraction are deleted. Append-only results just add their rows."""
        columns = self._columns()
        if self.plan.key is None:
            if net.where(F.col(WEIGHT) < 0).limit(1).count():
                raise RuntimeError(f"{self.table.name}: an append-only source retracted rows; run with a primary key")
            return net.withColumn("_n", F.explode(F.array_repeat(F.lit(1), F.col(WEIGHT).cast("int")))).select(*columns)
        key = self._key()
        upserts = net.where(F.col(WEIGHT) > 0).select(*columns).withColumn(DELETE, F.lit(False))
        gone = net.where(F.col(WEIGHT) < 0).select(*key).distinct()
        gone = gone.join(upserts, _same(gone, upserts, [(k, k) for k in key]), "left_anti")
        return upserts.unionByName(self._deletes(gone, key))

    def _fold_groups(self, net: DataFrame, old_sink: int, work: BarrierWork) -> DataFrame:
        """New values of the changed groups: arithmetic on SUM/COUNT/AVG, and a recompute from
        the snapshots for groups whose MIN/MAX lost its extreme value or that COUNT(DISTINCT)."""
        columns = self._columns()
        visible = [c for c in columns if not c.startswith(HIDDEN)]
        key = self._key()  # the GROUP BY columns
        groups = [f"{HIDDEN}g{i}" for i in range(len(key))]
        weight = F.col(WEIGHT)
        deltas = [F.sum(weight).alias("d_rows")]
        for i, agg in enumerate(self.plan.aggregates):
            arg = F.col(f"{HIDDEN}a{i}")
            if agg.func in ("sum", "avg", "count"):
                deltas.append(F.sum(F.when(arg.isNotNull(), weight).otherwise(0)).alias(f"d_nn{i}"))
            if agg.func in ("sum", "avg"):
                deltas.append(F.sum(arg * weight).alias(f"d_sum{i}"))
            elif agg.func in ("min", "max"):
                pick = F.min if agg.func == "min" else F.max
                deltas += [pick(F.when(weight > 0, arg)).alias(f"ins{i}"), pick(F.when(weight < 0, arg)).alias(f"ret{i}")]
        delta = net.groupBy(*groups).agg(*deltas)
        old = self.spark.read.format("delta").option("versionAsOf", old_sink).load(self.sink.path)
        old = old.select(*[F.col(c).alias(f"o_{c}") for c in columns])
        joined = delta.join(old, _same(delta, old, [(g, f"o_{k}") for g, k in zip(groups, key, strict=True)]), "left")

        rows = F.coalesce(F.col(f"o_{ROWS}"), F.lit(0)) + F.col("d_rows")
        values: dict[str, Column] = {k: F.col(g) for k, g in zip(key, groups, strict=True)}
        values[ROWS] = rows
        recompute: Column = F.lit(False)
        for i, agg in enumerate(self.plan.aggregates):
            name = visible[agg.position]
            old_value = F.col(f"o_{name}")
            if agg.func in ("sum", "avg", "count"):
                nn = F.coalesce(F.col(f"o_{HIDDEN}nn{i}"), F.lit(0)) + F.col(f"d_nn{i}")
                if agg.func == "count":
                    values[name] = F.coalesce(old_value, F.lit(0)) + F.col(f"d_nn{i}")
                    continue
                values[f"{HIDDEN}nn{i}"] = nn
                if agg.func == "sum":
                    values[name] = F.when(nn > 0, F.coalesce(old_value, F.lit(0)) + F.col(f"d_sum{i}"))
                else:
                    total = F.coalesce(F.col(f"o_{HIDDEN}sum{i}"), F.lit(0)) + F.col(f"d_sum{i}")
                    values[f"{HIDDEN}sum{i}"] = F.when(nn > 0, total)
                    values[name] = F.when(nn > 0, total / nn)
            elif agg.func == "count_star":
                values[name] = rows
            elif agg.func in ("min", "max"):
                lost = F.col(f"ret{i}") <= old_value if agg.func == "min" else F.col(f"ret{i}") >= old_value
                recompute = recompute | (F.col(f"ret{i}").isNotNull() & old_value.isNotNull() & lost)
                values[name] = (F.least if agg.func == "min" else F.greatest)(old_value, F.col(f"ins{i}"))
            else:  # count_distinct: recomputed below
                recompute = F.lit(True)
                values[name] = old_value
        assert self.schema is not None
        types = {f.name: f.dataType for f in self.schema.fields}
        new = joined.select(*[values[c].cast(types[c]).alias(c) for c in columns], recompute.alias("_recompute"))
        new = self._keep(new)
        kept = new.where(F.col(ROWS) > 0)
        upserts = kept.where(~F.col("_recompute")).drop("_recompute").withColumn(DELETE, F.lit(False))
        deletes = self._deletes(new.where(F.col(ROWS) <= 0), key)
        redo = kept.where(F.col("_recompute")).select(*key)
        if any(a.func in ("min", "max", "count_distinct") for a in self.plan.aggregates) and redo.limit(1).count():
            self._bind_snapshots(work)
            fresh = self.spark.sql(self.plan.full_query)
            fresh = fresh.join(F.broadcast(redo), _same(fresh, redo, [(k, k) for k in key]), "left_semi")
            upserts = upserts.unionByName(fresh.select(*columns).withColumn(DELETE, F.lit(False)))
        return upserts.unionByName(deletes)

    def _merge(self, rows: DataFrame) -> None:
        if DELETE not in rows.columns:
            rows.write.format("delta").mode("append").save(self.sink.path)
            return
        merge_by_key(self.spark, self.sink.path, rows, self._key(), self._columns(), DELETE, null_safe=True)
