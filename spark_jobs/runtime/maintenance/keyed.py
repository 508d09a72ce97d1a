"""Tables declared ``WITH ('state' = 'keyed')`` (``spark_jobs.planning.keyed``): a keyed join,
whose two sides' rows are kept by join key in Spark's state store, or a keyed aggregate, whose
groups' running aggregates are (a Top-N is one: each partition's first rows, a running
max_by). A barrier's new rows then find their matches, or their groups, by a key lookup
instead of by reading the tables, so a barrier costs what its changes cost, not what the
tables hold.

One streaming query per table runs for the job's life: Spark's stream-stream join (its joined
rows appended) or streaming aggregation (in update mode: the groups a batch changed) over each
source's staged rows, with the RocksDB state store. Its checkpoint is kept in the table's folder
(``_lockstep_state``): Delta's VACUUM leaves folders starting with ``_`` alone, and dropping the
table removes them with it. At each barrier:

1. Each source's new rows, tagged with the barrier (``BARRIER``), are staged as Parquet in the
   barrier's folder. The folder gets its name only once every source is written (a rename), so
   the query's file sources pick up the barrier's rows together, in one micro-batch. A barrier
   retried after a crash finds it there; the barrier's commit deletes it.
2. The job waits for the query to process them: one micro-batch, whose state is committed.
   The micro-batch's rows are written as Parquet by its ``foreachBatch``.
3. The job reads the rows of this barrier and commits them to the table (txn-marked): the
   joined rows appended, the changed groups MERGEd by the GROUP BY columns (or appended with
   their key and barrier, in the changelog layout: ``writes.append_groups``). A crash between
   2 and 3 leaves them on disk: the retried barrier's batch has already run, and the retried
   barrier commits them.

The state is rebuilt (a new folder; the sources' snapshots staged as the barrier's rows; the
table overwritten with the result) in these cases:
* at a generation's first barrier;
* for a table with no state;
* when a barrier updates or deletes a source row, which a join or a running aggregate of
  inserts cannot take back.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from coordinator.domain.snapshot import APPENDED, BARRIER, ROW_KEY
from coordinator.domain.work import BarrierWork
from coordinator.faults import crash_point
from spark_jobs.planning.keyed import top_n_query
from spark_jobs.planning.plan import WEIGHT, PlanKind, output_key
from spark_jobs.runtime.delta_log import table_bytes
from spark_jobs.runtime.maintenance.table import MaintainedTable
from spark_jobs.runtime.maintenance.writes import Written, append_groups, upsert_groups, write_result
from spark_jobs.runtime.storage import Storage

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

STATE_FOLDER = "_lockstep_state"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
TRIGGER = "100 milliseconds"  # how often the running query looks for a staged barrier


class KeyedState:
    """The state and streaming query of one keyed table (``TableMaintainer`` makes it)."""

    def __init__(self, t: MaintainedTable) -> None:
        self.t = t
        self.storage = Storage(t.spark)
        self.home = f"{t.sink.path.rstrip('/')}/{STATE_FOLDER}"
        self.folder: str | None = None  # the state the query runs on: g<generation>-b<barrier it started at>
        self.query: StreamingQuery | None = None
        self.schema: StructType | None = None  # the result rows', without BARRIER
        self.aggregate = t.plan.kind == PlanKind.KEYED_AGGREGATE  # (else a join)
        self._session: SparkSession | None = None

    def process(self, work: BarrierWork, base: tuple[dict[str, int], int] | None) -> Written:
        """Maintain the table at ``work``: from the state, or by rebuilding it."""
        if base is not None and self._current(work.generation) is not None:
            try:
                rows = self._inserted(base[0], work)
                if rows is not None:
                    return self._advance(work, rows, base[1])
            finally:
                self.t.release()
            log.info("table %s: barrier %d updates or deletes a source row; its keyed state is rebuilt",
                     self.t.table.name, work.barrier)
        return self._rebuild(work)

    def close(self) -> None:
        """Stop the streaming query (its state stays, checkpointed)."""
        if self.query is not None:
            self.query.stop()
            self.query = None

    # -- the state's folder -----------------------------------------------------------------------

    def _current(self, generation: int) -> str | None:
        """The newest state of this generation (found on disk after a restart), or None."""
        prefix = f"g{generation}-b"
        if self.folder is None or not self.folder.rsplit("/", 1)[1].startswith(prefix):
            self.close()
            started = [n for n in self.storage.names(self.home) if n.startswith(prefix) and n[len(prefix):].isdigit()]
            self.folder = f"{self.home}/{max(started, key=lambda n: int(n[len(prefix):]))}" if started else None
        return self.folder

    def _rebuild(self, work: BarrierWork) -> Written:
        """Start a new state from the sources' snapshots at the barrier, and overwrite the table."""
        self.close()
        self.folder = f"{self.home}/g{work.generation}-b{work.barrier}"
        self.storage.delete(self.folder)  # (a rebuild of this barrier that a crash cut short)
        return self._advance(work, self.t.snapshots(work), None)

    # -- a barrier ---------------------------------------------------------------------------------

    def _inserted(self, old: dict[str, int], work: BarrierWork) -> dict[str, DataFrame] | None:
        """Each changed source's inserted rows since ``old``; None if a change retracts a row."""
        rows = {}
        for source, version in work.source_versions.items():
            if old.get(source) == version:
                continue
            if source not in old:  # (a source the last commit did not record)
                return None
            changes, appended = self.t.changes_and_whether_appended(source, old[source], version)
            if not appended:  # the change data feed: read once for the check, once to stage it
                changes = self.t.cache(changes)
                if changes.where(F.col(WEIGHT) < 0).limit(1).count():
                    return None
            rows[source] = changes.drop(WEIGHT)
        return rows

    def _advance(self, work: BarrierWork, rows: dict[str, DataFrame], old_sink: int | None) -> Written:
        """Stage ``rows``, let the query join or aggregate them with the state, commit its rows
        to the table at version ``old_sink`` (None: a rebuild, which overwrites it)."""
        assert self.folder is not None
        with self.t.watch.phase("stage"):
            self._stage(rows, work.barrier)
        query = self._running(work)
        self._run_batch(query)
        crash_point("after_state_commit", self.t.crash_at)  # drills: the state has the batch, the table not yet
        out = f"{self.folder}/out"
        batches = [f"{out}/{n}" for n in self.storage.names(out) if not n.startswith(("_", "."))]
        assert self.schema is not None
        schema = StructType([*self.schema.fields, StructField(BARRIER, LongType())])
        changelog = self.t.plan.changelog

        def made() -> DataFrame:
            rows = self.t.spark.read.schema(schema).parquet(*batches).where(F.col(BARRIER) == work.barrier) \
                if batches else self.t.spark.createDataFrame([], schema)
            return with_row_key(self.t, rows, appended=old_sink is not None) if changelog else rows.drop(BARRIER)

        if old_sink is not None:
            writes = append_groups if changelog else upsert_groups
            written = writes(self.t, work, made(), old_sink) if self.aggregate \
                else write_result(self.t, work, made, "append")
        else:
            began = time.monotonic()
            written = write_result(self.t, work, made, "overwrite")
            if self.aggregate:  # what a rewrite costs (``upsert_groups`` chooses by it)
                self.t.costs.measured(True, time.monotonic() - began)
            if changelog:
                self.t.costs.laid_out(True, table_bytes(self.t.spark, self.t.sink.path))
        staged = f"{self.folder}/staged"
        for done in batches + [f"{staged}/{n}" for n in self.storage.names(staged)]:
            self.storage.delete(done)  # committed: the next barrier stages and joins rows of its own
        # the states before this one, at every barrier: a stopped query's state store may still
        # write its last snapshot in the background, making a deleted folder again
        for name in self.storage.names(self.home):
            if f"{self.home}/{name}" != self.folder:
                self.storage.delete(f"{self.home}/{name}")
        return written

    def _run_batch(self, query: StreamingQuery) -> None:
        """Let the query process what is staged; time it as Spark's progress splits it: the state
        work (the join's or aggregate's tasks: state lookups and updates), the state stores'
        commit (Spark sums it over the partitions: divided by those that run at once), the
        query's own work around the batch (listing the staged files, its offset and commit logs:
        "stream"), and the rest, waiting for its trigger ("wait")."""
        def batches() -> list[dict]:  # (an idle query reports progress too, with the next batch's id)
            return [p for p in query.recentProgress if "addBatch" in p["durationMs"]]

        before = max((p["batchId"] for p in batches()), default=-1)
        started = time.perf_counter()
        query.processAllAvailable()
        spent = (time.perf_counter() - started) * 1000
        ran = [p for p in batches() if p["batchId"] > before]
        batch = sum(p["durationMs"].get("addBatch", 0) for p in ran)
        triggers = sum(p["durationMs"].get("triggerExecution", 0) for p in ran)
        at_once = max(1, self.t.spark.sparkContext.defaultParallelism)
        commit = min(batch, sum(o.get("commitTimeMs", 0) / min(at_once, max(1, o.get("numShufflePartitions", 1)))
                                for p in ran for o in p["stateOperators"]))
        self.t.watch.add("state work", batch - commit)
        self.t.watch.add("state commit", commit)
        self.t.watch.add("stream", max(triggers - batch, 0))
        self.t.watch.add("wait", max(spent - triggers, 0))  # (a trigger's time includes its batch's)

    def _stage(self, rows: dict[str, DataFrame], barrier: int) -> None:
        """Write each source's ``rows`` of ``barrier`` in the barrier's folder, named when all are
        complete (once): two sources staged one by one would make two micro-batches, each with
        its planning, logs and state commit."""
        assert self.folder is not None
        staged = f"{self.folder}/staged/b{barrier}"
        if self.storage.exists(staged):
            return  # staged before a crash
        writing = f"{self.folder}/staged/_b{barrier}"
        self.storage.delete(writing)  # (a staging that a crash cut short)
        for source, frame in rows.items():
            frame.withColumn(BARRIER, F.lit(barrier).cast("long")).write.mode("overwrite").parquet(f"{writing}/{source}")
        if not self.storage.rename(writing, staged):
            raise OSError(f"could not rename {writing} to {staged}")

    def _running(self, work: BarrierWork) -> StreamingQuery:
        """The streaming query over the staged rows (started on the state's checkpoint)."""
        if self.query is not None and self.query.isActive:
            return self.query
        assert self.folder is not None
        if self._session is None:
            self._session = self.t.spark.newSession()  # its temp views are the streams, not the snapshots
            self._session.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
            self._session.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
            # a snapshot after every batch (uploaded in the background): a restart loads it, rather
            # than replaying the changelogs since the last one (the bootstrap's held every row: 104 s at 10M)
            self._session.conf.set("spark.sql.streaming.stateStore.minDeltasForSnapshot", "1")
        for source, version in work.source_versions.items():
            schema = self.t.snapshot(source, version).schema.add(BARRIER, LongType())
            stream = (self._session.readStream.schema(schema).option("maxFilesPerTrigger", 1 << 30)
                      .parquet(f"{self.folder}/staged/b*/{source}"))
            stream.createOrReplaceTempView(source)
        frame = self._session.sql(self._query())
        self.schema = StructType([f for f in frame.schema.fields if f.name != BARRIER])
        out = f"{self.folder}/out"

        def batch(rows: DataFrame, batch_id: int) -> None:  # rewritten whole if the batch is run again
            rows.write.mode("overwrite").parquet(f"{out}/b{batch_id}")

        self.query = (frame.writeStream.queryName(f"{self.t.job_id}_keyed").foreachBatch(batch)
                      .outputMode("update" if self.aggregate else "append")
                      .option("checkpointLocation", f"{self.folder}/checkpoint").trigger(processingTime=TRIGGER).start())
        return self.query

    def _query(self) -> str:
        """The streaming query: the plan's, or a Top-N's, made with its ORDER BY's types."""
        top = self.t.plan.top_n
        if top is None:
            return self.t.plan.change_query
        assert self._session is not None
        order = [sql for sql, _, _ in top.order]
        probe = self._session.sql(f"SELECT {', '.join(order)} FROM {top.source}")
        return top_n_query(top, {sql: f.dataType.simpleString() for sql, f in zip(order, probe.schema.fields, strict=True)})


def with_row_key(t: MaintainedTable, rows: DataFrame, appended: bool) -> DataFrame:
    """A changelog table's ``rows`` (with their ``BARRIER``) with their ``ROW_KEY``, the GROUP BY
    values (a Top-N's partition and rank) as JSON (times in UTC whatever the session's zone, so a
    key is the same string at every barrier), and whether they are ``APPENDED`` (else the
    table's whole, one row a key)."""
    key = output_key(t.plan, [c for c in rows.columns if c != BARRIER])
    assert key is not None
    return rows.withColumn(ROW_KEY, F.to_json(F.struct(*map(F.col, key)), {"timeZone": "UTC"})) \
        .withColumn(APPENDED, F.lit(appended))
