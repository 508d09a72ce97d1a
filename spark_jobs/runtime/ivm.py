"""Maintaining intermediate tables at each barrier, incrementally where the plan allows.

For barrier ``b`` the job knows the source versions it reflected last (``base``) and the
sources' exact points at ``b``. It turns the sources' changes between the two into **change
rows with a weight** (+n inserted, -n retracted):

* one source: its changes between the versions (the files its commits added, where they only
  appended; else Delta's change data feed), run through the query's FROM/WHERE/select list;
* a join of two tables: only the rows whose join key changed, computed from both sides'
  snapshots at the old versions (weight -1) and the new ones (+1); the rest of each side is
  never copied;
* INNER joins of more tables: the delta rule, one term per changed table (``_delta_rule``);
* UNION ALL of those: each branch's change rows;
* by group (``spark_jobs.planning.groups``): the query over the source rows of the groups the
  changes touch, at the new version (+1), and the table's old rows of those groups (-1);
  LEFT joins of more tables are kept by group of the FROM table's rows, and another table's
  changed rows touch the groups whose rows join them.
  When no result columns identify a row (a join of bids, which only grow and have no key),
  each group's rows are numbered, and the group columns with that number are the key;
* a Python function (``spark_jobs.planning.python_tables``) over one source, if Spark's plan of
  it is row-wise (``row_wise``): over a source that only grows, the function over its new rows,
  appended; over a keyed source, the function over the new images of its changed rows, replacing
  the rows of the keys they change (a key whose row is gone or filtered out is deleted). Rows the
  function raises on go to the table's dead letters (``<table>__dlq``), also when a function of
  one source is recomputed.

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
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pyspark.sql import Column, DataFrame, DataFrameWriter, Observation, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StructType

from coordinator.client.clock import now_ms
from coordinator.domain.errors import LockstepError
from coordinator.domain.events import dead_letters
from coordinator.domain.work import BarrierWork
from coordinator.settings import CrashAt
from spark_jobs.planning.groups import GroupValue, group_value
from spark_jobs.planning.pipeline import DerivedTable
from spark_jobs.planning.plans import HIDDEN, NUMBER, ROWS, WEIGHT, Plan, PlanKind, output_key
from spark_jobs.planning.python_tables import SESSION
from spark_jobs.runtime.commits import CompletionPublisher, DeltaSink, merge_by_key
from spark_jobs.runtime.costs import CostChoice
from spark_jobs.runtime.delta_log import appended_files, read_files, read_version, table_bytes
from spark_jobs.runtime.pruning import KEYS_LIMIT, few_keys, within
from spark_jobs.runtime.row_wise import failing_rows, key_problem, python_error, row_wise_problem
from spark_jobs.runtime.session import session_conf
from spark_jobs.runtime.stopwatch import Stopwatch

log = logging.getLogger(__name__)

DELETE = f"{HIDDEN}delete"
REWRITE_LIMIT_BYTES = 4 << 20
FILE_ROWS = 500_000  # rows per file of a whole write in key order (``_clustered``)
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
FUNCTION_DLQ_SCHEMA = "row STRING, error STRING, barrier BIGINT"  # a Python table's input row (JSON) and its error


def _same(left: DataFrame, right: DataFrame, pairs: list[tuple[str, str]]) -> Column:
    """Null-safe equality of column pairs: GROUP BY and join keys may be NULL."""
    return functools.reduce(lambda a, b: a & b, [left[x].eqNullSafe(right[y]) for x, y in pairs])


def _few(keys: DataFrame) -> tuple[DataFrame, list[Row] | None]:
    """The changed keys to join with, and their rows when few enough to filter reads with
    (read once, then joined from the driver's copy); else broadcast as they are."""
    found = few_keys(keys)
    return (F.broadcast(keys), None) if found is None else (F.broadcast(found[0]), found[1])


def _narrowed(frame: DataFrame, rows: list[Row] | None, pairs: list[tuple[str, str]]) -> DataFrame:
    """``frame`` filtered to the value ranges of the changed keys ``rows`` (``pruning.within``)."""
    return frame if rows is None or not pairs else frame.where(within(rows, pairs))


def _visible(frame: DataFrame) -> DataFrame:
    """A table's rows as its readers see them: without the bookkeeping columns (``HIDDEN``)."""
    return frame.select(*[c for c in frame.columns if not c.startswith(HIDDEN)])


def _netted(rows: DataFrame) -> DataFrame:
    """Change rows with equal values summed: those whose weights cancel are gone."""
    value_columns = [c for c in rows.columns if c != WEIGHT]
    return rows.groupBy(*value_columns).agg(F.sum(WEIGHT).alias(WEIGHT)).where(F.col(WEIGHT) != 0)


def _held(value: GroupValue) -> Column:
    """A source row's group value (a time window: the window, several rows when it slides)."""
    return F.col(value.column) if value.column else F.expr(value.expression)


def _of_groups(rows: DataFrame, held: list[GroupValue], names: list[str], touched: DataFrame,
               found: list[Row] | None) -> DataFrame:
    """The source ``rows`` of the ``touched`` groups (columns ``names``), which each row holds
    as ``held``: equal values, or a time within a touched window. ``found`` (the touched
    groups, when few) narrows the read to their value and time ranges first."""
    rows = _narrowed(rows, found, [(v.column, n) for v, n in zip(held, names, strict=True) if v.column])
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


@dataclass
class TableMaintainer:
    """Runs one derived table's job: ``process(work)`` for every barrier, in order."""

    spark: SparkSession
    table: DerivedTable
    plan: Plan
    job_id: str
    locate: Callable[[str], str]  # table name -> its location (Settings.table_location)
    publisher: CompletionPublisher
    # A table up to this size is rewritten whole at each barrier (one Spark job); a larger one
    # gets a MERGE of the changed rows (which reads and rewrites only the files they touch). A
    # rewrite grows with the table: a 10M-row join result took 11 s a barrier rewritten, 3.2 s
    # MERGEd (docs/benchmarks.md).
    rewrite_limit_bytes: int = REWRITE_LIMIT_BYTES
    crash_at: CrashAt | None = None  # drills only (LOCKSTEP_CRASH_AT)
    compact_every: int = 0  # LOCKSTEP_COMPACT_EVERY (0: never)
    costs: CostChoice = field(default_factory=CostChoice)  # applying the changes or recomputing, by cost

    def __post_init__(self) -> None:
        # The table is created by its first barrier's write (CREATE TABLE AS SELECT is atomic).
        self.sink = DeltaSink(self.spark, self.locate(self.table.name), self.job_id, None, create_on_first_write=True,
                              crash_at=self.crash_at, compact_every=self.compact_every, name=self.table.name)
        self.schema: StructType | None = None
        if self.sink.exists:
            self.schema = self.spark.read.format("delta").load(self.sink.path).schema
        # generation, the source versions reflected, and the sink version
        self.base: tuple[int, dict[str, int], int] | None = None
        self.query_id = hashlib.sha256(self.table.query.encode()).hexdigest()[:16]
        self._cached: list[DataFrame] = []
        self._row_wise_checked = False  # a ROW_WISE plan's function was found row-wise (or the plan changed)
        self.dlq: DeltaSink | None = None  # a Python table's dead letters, made at the first one
        self.watch = Stopwatch()  # the phases of the barrier in progress

    # -- reading sources ------------------------------------------------------------------------

    def snapshot(self, table: str, version: int) -> DataFrame:
        return read_version(self.spark, self.locate(table), version)

    def changes(self, table: str, old: int, new: int) -> DataFrame:
        """Rows of ``table`` changed in versions ``(old, new]`` with a weight of +1 or -1."""
        return self._changes(table, old, new)[0]

    def _changes(self, table: str, old: int, new: int) -> tuple[DataFrame, bool]:
        """``changes``, and whether they are just the files those versions added, where they only
        appended (``appended_files``: all weights +1); else they are Delta's change data feed."""
        location = self.locate(table)
        appended = appended_files(self.spark, location, old, new)
        if appended is not None:
            return read_files(self.spark, *appended).withColumn(WEIGHT, F.lit(1)), True
        # read as the path identifier delta.`path`: `.load(path)` passes the options to Delta twice
        # (their given and lower-case spellings) and Spark warns three times a read
        path = location.replace("`", "``")
        feed = (self.spark.read.option("readChangeFeed", "true").option("startingVersion", old + 1)
                .option("endingVersion", new).table(f"delta.`{path}`"))
        sign = F.when(F.col("_change_type").isin("insert", "update_postimage"), 1).otherwise(-1)
        return feed.withColumn(WEIGHT, sign).drop(*CDF_COLUMNS), False

    def _snapshots(self, work: BarrierWork) -> dict[str, DataFrame]:
        """Each source at its exact-point version for the barrier."""
        return {s: self.snapshot(s, v) for s, v in work.source_versions.items()}

    def _bind_snapshots(self, work: BarrierWork) -> None:
        """Bind each source to its exact-point version for the barrier."""
        self._bind(self._snapshots(work))

    def _bind(self, frames: dict[str, DataFrame]) -> None:
        """Name each source in this job's own session (temp views), for the query to read."""
        for name, frame in frames.items():
            frame.createOrReplaceTempView(name)

    # -- the barrier loop -----------------------------------------------------------------------

    def close(self) -> None:
        """The job's query stopped: finish its table's upkeep (``DeltaSink.close``), let go of its producer."""
        self.sink.close()
        if self.dlq is not None:
            self.dlq.close()
        self.publisher.close()

    def process(self, work: BarrierWork) -> None:
        started = now_ms()
        self.watch = Stopwatch()
        sources = dict(work.source_versions)
        done = self.sink.versions.get((work.generation, work.barrier))
        counts = (0, 0, 0)
        if done is not None:  # committed before a restart: only the completion may be missing
            version = done
        else:
            base = self._base(work)
            if base is not None and base[0] == sources:
                version = base[1]  # no source changed: same version as the barrier before
            else:
                version, counts = self._maintain(work, base)
        self.base = (work.generation, sources, version)
        self.publisher.publish(self.job_id, self.table.name, work.barrier, work.generation, version, started,
                               counts, source_versions=sources, phases=self.watch.phases())

    def _maintain(self, work: BarrierWork, base: tuple[dict[str, int], int] | None) -> tuple[int, tuple[int, int, int]]:
        """Apply the changes, or recompute: the first barrier, a plan that is not incremental, or a
        table whose changes cost more to apply than recomputing it did (``costs``)."""
        if self.plan.kind == PlanKind.ROW_WISE and not self._row_wise_checked:
            self._check_row_wise(work)
        whole = base is None or not self.plan.incremental
        if not whole and self.costs.whole():
            whole = True
            log.info("table %s: recomputing it (%.1f s last time) is cheaper than applying its changes (%.1f s)",
                     self.table.name, self.costs.whole_s, self.costs.applied_s)
        began = time.monotonic()
        if self.plan.kind == PlanKind.ROW_WISE:
            version, counts = self._row_wise(work, None if whole else base)
        elif whole:
            version, counts = self._recompute(work)
        else:
            version, counts = self._apply(work, base)  # type: ignore[arg-type]
        if self.plan.incremental:
            self.costs.measured(whole, time.monotonic() - began)
        return version, counts

    def _base(self, work: BarrierWork) -> tuple[dict[str, int], int] | None:
        """What the table reflects before ``work``: None (recompute) in a new generation (a
        revision) or when the job's query changed since the table's last commit."""
        if self.base is not None and self.base[0] == work.generation:
            return self.base[1], self.base[2]
        last = self.sink.last_commit(work.generation, work.barrier)
        if last is None or self.sink.queries.get((work.generation, last[0]), self.query_id) != self.query_id:
            return None
        sources = self.sink.sources.get((work.generation, last[0]))
        self.costs.restore(self.sink.costs.get((work.generation, last[0]), {}))  # (a restart: measured before)
        return None if sources is None else (sources, last[1])

    def _costs(self) -> dict[str, float] | None:
        """What the job measured of its ways to a barrier, kept with the commit (incremental plans)."""
        return self.costs.state() if self.plan.incremental else None

    def _recompute(self, work: BarrierWork) -> tuple[int, tuple[int, int, int]]:
        """Compute the whole table from the sources' snapshots at the barrier and overwrite it
        (one Spark job; its rows are counted on the way)."""
        if self.table.python is not None:
            frames = self._snapshots(work)
            if len(frames) > 1:  # no one input to find the rows it raises on in
                return self._write_result(work, lambda: self._call(frames), "overwrite")
            ((source, rows),) = frames.items()
            return self._despite_bad_rows(
                work, source, rows, lambda good: self._write_result(work, lambda: self._call({source: good}), "overwrite"),
                whole=True)

        def result() -> DataFrame:
            self._bind_snapshots(work)
            return self._numbered(self.spark.sql(self.plan.full_query or self.plan.query))

        return self._write_result(work, result, "overwrite")

    def _call(self, frames: dict[str, DataFrame]) -> DataFrame:
        """A Python table's function over ``frames`` (source name -> its rows, without the
        bookkeeping columns readers never see), and the session if it asks."""
        python = self.table.python
        assert python is not None
        arguments: dict[str, object] = {name: _visible(frame) for name, frame in frames.items()}
        if python.wants_session:
            arguments[SESSION] = self.spark
        result = python.function(**arguments)
        if not isinstance(result, DataFrame):
            raise LockstepError(f"{python.origin}: {python.function.__name__} returned a {type(result).__name__}, "
                                "not a DataFrame; return the DataFrame of the table's rows")
        return result

    def _check_row_wise(self, work: BarrierWork) -> None:
        """Keep a ROW_WISE plan only for a function that is row-wise (its analyzed plan, no action);
        else the table is recomputed at every barrier, and the log says why."""
        result = self._call(self._snapshots(work))
        problem = row_wise_problem(result)
        if problem is None and self.plan.key is not None:
            problem = key_problem(result, self.plan.sources[0], [str(k) for k in self.plan.key])
        if problem is not None:
            self.plan = replace(self.plan, kind=PlanKind.FULL_REFRESH, reason=problem, key=None, append_only=False,
                                inserts_only=False)
            log.warning("table %s: recomputed at every barrier, not from its source's changed rows: %s",
                        self.table.name, problem)
        self._row_wise_checked = True

    def _row_wise(self, work: BarrierWork, base: tuple[dict[str, int], int] | None) -> tuple[int, tuple[int, int, int]]:
        """A row-wise function's table: the function over its source's changed rows since ``base``
        (new rows appended, or a keyed source's rows replaced: ``_replaced``); with no base, or
        a source that only grows but changed rows after all, over all its rows, replacing the
        table. Rows it raises on go to the dead letters with the error, and the rest is committed."""
        (source,) = self.plan.sources
        new = work.source_versions[source]
        if base is not None and self.plan.key is not None:
            return self._replaced(work, base)
        rows = None if base is None else self._grown(source, base[0][source], new)
        if base is not None and rows is None:
            log.warning("table %s: %s changed or removed rows by barrier %d (a table that only grows should not): "
                        "recomputed from all its rows", self.table.name, source, work.barrier)
        mode = "overwrite" if rows is None else "append"
        return self._despite_bad_rows(work, source, self.snapshot(source, new) if rows is None else rows,
                                      lambda good: self._write_result(work, lambda: self._call({source: good}), mode),
                                      whole=rows is None)

    def _grown(self, source: str, old: int, new: int) -> DataFrame | None:
        """The rows versions ``(old, new]`` of ``source`` added, or None if they also changed or
        removed rows (an UPDATE by hand): a Spark job to look, only where they were not appends."""
        changed, appended = self._changes(source, old, new)
        if not appended and changed.where(F.col(WEIGHT) < 0).limit(1).count():
            return None
        return changed.drop(WEIGHT)

    def _replaced(self, work: BarrierWork, base: tuple[dict[str, int], int]) -> tuple[int, tuple[int, int, int]]:
        """A row-wise function over a keyed source: the function over the new images of the rows
        that changed since ``base``, replacing the table's rows of their keys (by ``_apply``: a
        MERGE, or a rewrite of a small table). A key whose row is gone, or whose new row the
        function filters out or raises on, loses its row."""
        (source,) = self.plan.sources
        changed = self.changes(source, base[0][source], work.source_versions[source])
        net = self._keep(_netted(changed))
        key = {str(k).lower() for k in self.plan.key or ()}  # (the function may spell them otherwise: OID)

        def replace_keys(rows: DataFrame) -> tuple[int, tuple[int, int, int]]:
            result = self._call({source: rows})
            self.schema = result.schema
            # (aliased: the same attributes as the result's key, which would make joining them a self-join)
            touched = net.select(*[F.col(f.name).alias(f.name) if f.name.lower() in key
                                   else F.lit(None).cast(f.dataType).alias(f.name) for f in result.schema.fields]).distinct()
            return self._apply(work, base, result.withColumn(WEIGHT, F.lit(1))
                               .unionByName(touched.withColumn(WEIGHT, F.lit(-1))))

        return self._despite_bad_rows(work, source, net.where(F.col(WEIGHT) > 0).drop(WEIGHT), replace_keys)

    def _despite_bad_rows(self, work: BarrierWork, source: str, rows: DataFrame,
                          attempt: Callable[[DataFrame], tuple[int, tuple[int, int, int]]],
                          whole: bool = False) -> tuple[int, tuple[int, int, int]]:
        """``attempt`` with the function over ``rows`` of ``source`` (``whole``: all its rows);
        if the function raises on some of them, ``attempt`` again without those, which go to the
        dead letters with the error. A function that fails on no row alone fails the barrier, as
        any other error."""
        rows = _visible(rows)  # (the dead letters hold what the function was given)
        try:
            return attempt(rows)
        except Exception as exc:
            if python_error(exc) is None:
                raise
            failure = exc
        with self.watch.phase("dead_letters"):
            good, letters = failing_rows(rows, lambda part: self._call({source: part}))
            if not letters:
                raise failure
            self._dead_letters(letters, work, whole)
        return attempt(good)

    def _write_result(self, work: BarrierWork, result: Callable[[], DataFrame],
                      mode: str) -> tuple[int, tuple[int, int, int]]:
        """Commit the rows ``result`` makes (in the barrier's plan phase), appended, or overwriting
        the table (in key order, its schema replaced): one Spark job, which counts them on the way."""
        with self.watch.phase("plan"):
            frame = result()
            self.schema = frame.schema
            observation = self._observation(work)
            counted = frame.observe(observation, F.count(F.lit(1)).alias("rows"))
        path = self.sink.path
        writer = self._clustered(counted).option("overwriteSchema", "true") if mode == "overwrite" \
            else counted.write.format("delta")
        version = self.sink.commit(work.barrier, work.generation, lambda: writer.mode(mode).save(path),
                                   work.source_versions, self.query_id, self.watch, self._costs())
        rows = int(observation.get["rows"]) if self.sink.written else 0
        return version, (rows, rows, 0)

    def _dead_letters(self, letters: list[tuple[str, str]], work: BarrierWork, whole: bool) -> None:
        """The input rows the function raised on, each with the error, in ``<table>__dlq`` (one
        commit per barrier with its txn mark, as the table's). ``whole``: the letters come from
        all the source's rows, so those an earlier barrier kept already are not kept again."""
        name = dead_letters(self.table.name)
        dlq = self.dlq = self.dlq or DeltaSink(self.spark, self.locate(name), dead_letters(self.job_id), FUNCTION_DLQ_SCHEMA,
                                               crash_at=self.crash_at, compact_every=self.compact_every, name=name,
                                               lazy_history=True)
        if whole:
            kept = read_version(self.spark, dlq.path, None).where(F.col("row").isin([row for row, _ in letters]))
            known = {(r["row"], r["error"]) for r in kept.select("row", "error").collect()}
            letters = [letter for letter in letters if letter not in known]
        if not letters:
            return
        frame = self.spark.createDataFrame([(row, error, work.barrier) for row, error in letters], FUNCTION_DLQ_SCHEMA)
        dlq.commit(work.barrier, work.generation, lambda: frame.write.format("delta").mode("append").save(dlq.path))
        log.warning("table %s: %d row(s) of barrier %d raised in its function, kept in %s: %s", self.table.name,
                    len(letters), work.barrier, dead_letters(self.table.name), letters[0][1])

    def _observation(self, work: BarrierWork) -> Observation:
        return Observation(f"{self.job_id}_{work.generation}_{work.barrier}_{uuid.uuid4().hex[:6]}")

    def _apply(self, work: BarrierWork, base: tuple[dict[str, int], int],
               net: DataFrame | None = None) -> tuple[int, tuple[int, int, int]]:
        """Turn the sources' changes into weighted change rows (or take ``net``, netted already)
        and apply them: a small table is rewritten whole in one Spark job (old rows with the
        changes folded in); a large one gets a MERGE of just the changed rows."""
        old_versions, old_sink = base
        path = self.sink.path
        try:
            with self.watch.phase("plan"):
                if net is None:
                    rows = self._change_rows(old_versions, work.source_versions, old_sink)
                    # nothing is ever retracted where every change row is an insert (weight +1)
                    net = rows if self.plan.inserts_only else _netted(rows)
                if self.plan.kind == PlanKind.GROUPS:
                    net = self._keep(net)  # read three times (upserts, retractions, gone keys): compute it once
                observation = self._observation(work)
                if self.plan.key is None:  # an append-only result: add the new rows
                    added = self._appended(net).observe(observation, F.count(F.lit(1)).alias("changed"))
                    write = lambda: added.write.format("delta").mode("append").save(path)  # noqa: E731
                elif table_bytes(self.spark, path) <= self.rewrite_limit_bytes:
                    whole = self._rewritten(net, old_sink, work, observation)

                    def write() -> None:  # a small table's shuffles in one task each, into one file
                        with session_conf(self.spark, {"spark.sql.shuffle.partitions": "1"}):
                            self._clustered(whole).mode("overwrite").save(path)
                else:
                    write = None
            if write is None:
                return self._merged(net, old_sink, work)
            version = self.sink.commit(work.barrier, work.generation, write, work.source_versions, self.query_id,
                                       self.watch, self._costs())
            changed = int(observation.get["changed"]) if self.sink.written else 0
            return version, (changed, changed, 0)
        finally:
            for frame in self._cached:
                frame.unpersist()
            self._cached.clear()

    def _merged(self, net: DataFrame, old_sink: int, work: BarrierWork) -> tuple[int, tuple[int, int, int]]:
        """MERGE the changed rows (upserts and deletes by key) into a large table."""
        key = self._key()
        with self.watch.phase("changes"):
            if self.plan.aggregated:  # (groups that lost their MIN/MAX are recomputed here: an action)
                new = self._keep(self._group_values(net, old_sink, whole=False))
                rows = self._redo(new.where(F.col(ROWS) > 0), work).drop("_changed").withColumn(DELETE, F.lit(False))
                changes = rows.unionByName(self._deletes(new.where(F.col(ROWS) <= 0), key))
            else:
                changes = self._by_key(net)
            changes = self._keep(changes)
            changed = changes.count()  # computes the change once; the MERGE reads it from the cache
            # few changed keys: the MERGE opens only the files whose key ranges may hold them
            target = within(changes.select(*key).collect(), [(f"t.`{k}`", k) for k in key]) \
                if 0 < changed <= KEYS_LIMIT else None
        if not changed:
            return old_sink, (0, 0, 0)
        version = self.sink.commit(
            work.barrier, work.generation,
            lambda: merge_by_key(self.spark, self.sink.path, changes, key, self._columns(), DELETE, null_safe=True,
                                 target=target),
            work.source_versions, self.query_id, self.watch, self._costs())
        return version, (changed, changed, 0)

    def _clustered(self, frame: DataFrame) -> DataFrameWriter:
        """A whole write of a table kept by key, in key order in files of at most ``FILE_ROWS``
        rows: each file holds a narrow range of keys, so a later MERGE of a few keys rewrites
        only the files whose ranges hold them (``pruning``) instead of every file."""
        key = output_key(self.plan, [c for c in frame.columns if not c.startswith(HIDDEN)])
        if not self.plan.incremental or not key or "" in key:
            return frame.write.format("delta")
        return frame.sortWithinPartitions(*key).write.format("delta").option("maxRecordsPerFile", FILE_ROWS)

    def _keep(self, frame: DataFrame) -> DataFrame:
        """Cache a frame used more than once in this barrier; released when the barrier is done."""
        self._cached.append(frame.cache())
        return frame

    # -- change rows ----------------------------------------------------------------------------

    def _change_rows(self, old: dict[str, int], new: dict[str, int], old_sink: int, plan: Plan | None = None) -> DataFrame:
        plan = plan or self.plan
        if plan.kind == PlanKind.UNION:  # each branch's change rows, by position, named as the first branch's
            frames = [self._change_rows(old, new, old_sink, b) for b in plan.branches
                      if any(old[s] != new[s] for s in b.sources)]
            return functools.reduce(DataFrame.union, frames).toDF(*frames[0].columns)
        if plan.kind == PlanKind.GROUPS:
            return self._group_rows(old, new, old_sink)
        if len(plan.sources) > 2:
            return self._delta_rule(old, new, plan)
        if not plan.join_columns:
            (source,) = plan.sources
            self._bind({source: self.changes(source, old[source], new[source])})
            return self.spark.sql(plan.change_query)
        left, right = plan.join_columns  # FROM table first
        keys = [f"{HIDDEN}k{i}" for i in range(len(plan.join_columns[left]))]
        pairs = {t: list(zip(plan.join_columns[t], keys, strict=True)) for t in (left, right)}
        touched = [self.changes(t, old[t], new[t]).select(*[F.col(c).alias(k) for c, k in pairs[t]])
                   for t in (left, right) if old[t] != new[t]]
        changed_keys, found = _few(functools.reduce(DataFrame.unionByName, touched).distinct())

        def side(table: str, version: int, weight: int) -> DataFrame:
            frame = _narrowed(self.snapshot(table, version), found, pairs[table])
            near = frame.join(changed_keys, _same(frame, changed_keys, pairs[table]), "left_semi")
            return near.withColumn(WEIGHT, F.lit(weight))

        self._bind({left: side(left, old[left], -1), right: side(right, old[right], 1)})
        before = self.spark.sql(plan.change_query)
        self._bind({left: side(left, new[left], 1), right: side(right, new[right], 1)})
        after = self.spark.sql(plan.change_query)
        return before.unionByName(after)

    def _delta_rule(self, old: dict[str, int], new: dict[str, int], plan: Plan) -> DataFrame:
        """INNER joins of three or more tables: new(A⋈B⋈C) - old(A⋈B⋈C) is the sum over the changed
        tables T of T's change rows (weight ±1) joined with the tables before T at their new
        version and those after T at their old one. Each term reads one table's changes, which
        are broadcast, so the other tables are scanned but never shuffled whole."""
        terms: list[DataFrame] = []
        for i, table in enumerate(plan.sources):
            if old[table] == new[table]:
                continue
            frames = {t: self.snapshot(t, new[t] if j < i else old[t]).withColumn(WEIGHT, F.lit(1))
                      for j, t in enumerate(plan.sources) if t != table}
            frames[table] = F.broadcast(self.changes(table, old[table], new[table]))
            self._bind(frames)
            terms.append(self.spark.sql(plan.change_query))
        return functools.reduce(DataFrame.unionByName, terms)

    def _group_rows(self, old: dict[str, int], new: dict[str, int], old_sink: int) -> DataFrame:
        """The groups shape: the rows of the groups the sources' changes touch, recomputed from
        the sources' rows of those groups (+1), and the table's old rows of those groups (-1).
        A few touched groups also filter every read (``pruning``): only files that may hold
        them are opened."""
        names = list(self.plan.group_columns)
        values = {t: [group_value(c) for c in columns] for t, columns in self.plan.group_sources.items()}
        changed = [self.changes(t, old[t], new[t]).select(*[_held(v).alias(n) for v, n in zip(held, names, strict=True)])
                   for t, held in values.items() if old[t] != new[t]]
        for table, query in self.plan.reach.items():  # LEFT joins: the groups that reach the table's changed rows
            if old[table] != new[table]:
                self._bind({t: self.snapshot(t, new[t]) for t in self.plan.sources if t != table})
                self._bind({table: self.changes(table, old[table], new[table])})
                changed.append(self.spark.sql(query).toDF(*names))
        touched, found = _few(functools.reduce(DataFrame.unionByName, changed).distinct())
        frames = {t: self.snapshot(t, new[t]) for t in self.plan.reach}  # (read whole)
        for table, held in values.items():
            frames[table] = _of_groups(self.snapshot(table, new[table]), held, names, touched, found)
        self._bind(frames)
        fresh = self._numbered(self.spark.sql(self.plan.query))
        pairs = [(n, n) for n in names]
        table = _narrowed(read_version(self.spark, self.sink.path, old_sink), found, pairs)
        before = table.join(touched, _same(table, touched, pairs), "left_semi").select(*fresh.columns)
        return fresh.withColumn(WEIGHT, F.lit(1)).unionByName(before.withColumn(WEIGHT, F.lit(-1)))

    def _numbered(self, result: DataFrame) -> DataFrame:
        """The query's rows with their number within their group, where that number is part of
        the key (``NUMBER``): ordered by every column, so equal groups number equal rows alike."""
        if self.plan.kind != PlanKind.GROUPS or NUMBER not in (self.plan.key or ()):
            return result
        order = [F.to_json(result[f.name]) if isinstance(f.dataType, MapType) else result[f.name]
                 for f in result.schema.fields]  # (maps have no order)
        group = Window.partitionBy(*[result[c] for c in self.plan.group_columns]).orderBy(*order)
        return result.withColumn(NUMBER, F.row_number().over(group))

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

    def _appended(self, net: DataFrame) -> DataFrame:
        """An append-only result's new rows: each change row as often as its weight. Its inputs
        only grow, so a retraction means a source broke that promise: the write fails then."""
        if self.plan.inserts_only:
            return net.select(*self._columns())
        message = f"{self.table.name}: an append-only source retracted rows; run with a primary key"
        grown = net.where(F.assert_true(F.col(WEIGHT) > 0, message).isNull())
        return grown.withColumn("_n", F.explode(F.array_repeat(F.lit(1), F.col(WEIGHT).cast("int")))).select(*self._columns())

    def _upserts_and_gone(self, net: DataFrame) -> tuple[DataFrame, DataFrame]:
        """Projection and join rows by key: the rows with positive weight win; keys with only a
        retraction are gone."""
        key = self._key()
        upserts = net.where(F.col(WEIGHT) > 0).select(*self._columns())
        gone = net.where(F.col(WEIGHT) < 0).select(*key).distinct()
        return upserts, gone.join(upserts, _same(gone, upserts, [(k, k) for k in key]), "left_anti")

    def _by_key(self, net: DataFrame) -> DataFrame:
        """MERGE rows of a projection or join: upserts, and deletes of the keys that are gone."""
        upserts, gone = self._upserts_and_gone(net)
        return upserts.withColumn(DELETE, F.lit(False)).unionByName(self._deletes(gone, self._key()))

    def _rewritten(self, net: DataFrame, old_sink: int, work: BarrierWork, observation: Observation) -> DataFrame:
        """The whole new table: the rows at ``old_sink`` with the changes applied. ``observation``
        counts the changed rows."""
        if self.plan.aggregated:
            new = self._group_values(net, old_sink, whole=True)
            result = self._redo(new.where(F.col(ROWS) > 0), work)
        else:
            key = self._key()
            upserts, gone = self._upserts_and_gone(net)
            touched = upserts.select(*key).unionByName(gone)
            old = read_version(self.spark, self.sink.path, old_sink)
            kept = old.join(touched, _same(old, touched, [(k, k) for k in key]), "left_anti")
            result = kept.withColumn("_changed", F.lit(False)).unionByName(upserts.withColumn("_changed", F.lit(True)))
        changed = F.coalesce(F.sum(F.col("_changed").cast("long")), F.lit(0))  # (no rows at all: 0)
        return result.observe(observation, changed.alias("changed")).drop("_changed")

    def _group_values(self, net: DataFrame, old_sink: int, whole: bool) -> DataFrame:
        """Aggregate values after the change: arithmetic on SUM/COUNT/AVG and on MIN/MAX that did
        not lose their extreme value. ``whole``: every group of the table, else only the changed
        ones. Columns ``_changed`` and ``_recompute`` (a MIN/MAX lost its extreme value, or a
        COUNT(DISTINCT) changed) say which groups ``_redo`` recomputes."""
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
        old = read_version(self.spark, self.sink.path, old_sink)
        old = old.select(*[F.col(c).alias(f"o_{c}") for c in columns])
        on = _same(delta, old, [(g, f"o_{k}") for g, k in zip(groups, key, strict=True)])
        joined = delta.join(old, on, "full_outer" if whole else "left")

        def d(name: str) -> Column:  # a group the barrier did not touch has no delta: 0
            return F.coalesce(F.col(name), F.lit(0))

        rows = F.coalesce(F.col(f"o_{ROWS}"), F.lit(0)) + d("d_rows")
        values: dict[str, Column] = {k: F.coalesce(F.col(g), F.col(f"o_{k}")) if whole else F.col(g)
                                     for k, g in zip(key, groups, strict=True)}
        values[ROWS] = rows
        recompute: Column = F.lit(False)
        for i, agg in enumerate(self.plan.aggregates):
            name = visible[agg.position]
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
            else:  # count_distinct: recomputed by _redo
                recompute = F.lit(True)
                values[name] = old_value
        changed = F.col("d_rows").isNotNull()
        assert self.schema is not None
        types = {f.name: f.dataType for f in self.schema.fields}
        return joined.select(*[values[c].cast(types[c]).alias(c) for c in columns],
                             (changed & recompute).alias("_recompute"), changed.alias("_changed"))

    def _redo(self, kept: DataFrame, work: BarrierWork) -> DataFrame:
        """``kept`` groups, with those marked ``_recompute`` computed again from the sources'
        snapshots at the barrier (only when MIN/MAX/COUNT(DISTINCT) may need it)."""
        columns = [*self._columns(), "_changed"]
        funcs = {a.func for a in self.plan.aggregates}
        # new rows alone lose no extreme value, but they may bring a new distinct one
        if "count_distinct" not in funcs and (self.plan.inserts_only or not funcs & {"min", "max"}):
            return kept.select(*columns)
        kept = self._keep(kept)
        key = self._key()
        redo = kept.where(F.col("_recompute")).select(*key)
        if not redo.limit(1).count():
            return kept.select(*columns)
        self._bind_snapshots(work)
        fresh = self.spark.sql(self.plan.full_query)
        fresh = fresh.join(F.broadcast(redo), _same(fresh, redo, [(k, k) for k in key]), "left_semi")
        return kept.where(~F.col("_recompute")).select(*columns).unionByName(
            fresh.select(*self._columns()).withColumn("_changed", F.lit(True)))
