"""One streaming query over rows staged barrier by barrier, its state in Spark's state store
(RocksDB) and its checkpoint in a folder kept with the table: what a keyed table
(``maintenance.keyed``) and the changes of a changelog table (``maintenance.changelog_changes``)
run on.

The query runs for the job's life, one micro-batch a barrier:

1. Each source's rows of the barrier are staged as Parquet in the barrier's folder
   (``staged/b<barrier>/<source>``): the data files that hold just them copied as they are (a
   source's appended files: no Spark job), else written. The query reads the barrier of each
   row (``BARRIER``) from its file's path. The folder gets its name only once every source is
   there (a rename), so the query's file sources pick up the barrier's rows together, in one
   micro-batch. A barrier retried after a crash finds it there.
2. The job waits for the query to process them: one micro-batch, whose state is committed.
   Its rows are written as Parquet by its ``foreachBatch``, where the barrier's commit reads
   them (``output``). A crash before that commit leaves them on disk: the retried barrier's
   batch has already run, and it reads them again.
3. After the commit, ``finish`` deletes what the barrier staged and made.

The folder is ``g<generation>-b<barrier it started at>`` under the stream's home (Delta's
VACUUM leaves folders starting with ``_`` alone, and dropping the table removes them with it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from coordinator.domain.snapshot import BARRIER
from spark_jobs.runtime.stopwatch import Stopwatch
from spark_jobs.runtime.storage import Storage

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

STATE_FOLDER = "_lockstep_state"  # in a table's folder: the state of its streams
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
TRIGGER = "100 milliseconds"  # how often the running query looks for a staged barrier


class StateStream:
    """A streaming query of ``name`` with its state under ``home``, in ``mode`` ("update": the
    groups a batch changed; "append"); ``keep_first``: the first batch of a new state (its
    bootstrap) is written too, else only run for its state."""

    def __init__(self, spark: SparkSession, home: str, name: str, mode: str, keep_first: bool = True) -> None:
        self.spark, self.home, self.name, self.mode, self.keep_first = spark, home, name, mode, keep_first
        self.storage = Storage(spark)
        self.folder: str | None = None  # the state the query runs on: g<generation>-b<barrier it started at>
        self.query: StreamingQuery | None = None
        self.schema: StructType | None = None  # the output rows', without BARRIER
        self._session: SparkSession | None = None

    def close(self) -> None:
        """Stop the streaming query (its state stays, checkpointed)."""
        if self.query is not None:
            self.query.stop()
            self.query = None

    def current(self, generation: int) -> str | None:
        """The newest state of this generation (found on disk after a restart), or None."""
        prefix = f"g{generation}-b"
        if self.folder is None or not self.folder.rsplit("/", 1)[1].startswith(prefix):
            self.close()
            started = [n for n in self.storage.names(self.home) if n.startswith(prefix) and n[len(prefix):].isdigit()]
            self.folder = f"{self.home}/{max(started, key=lambda n: int(n[len(prefix):]))}" if started else None
        return self.folder

    def start_new(self, generation: int, barrier: int) -> None:
        """A new, empty state for ``generation`` from ``barrier`` on (its first batch builds it)."""
        self.close()
        self.folder = f"{self.home}/g{generation}-b{barrier}"
        self.storage.delete(self.folder)  # (a start at this barrier that a crash cut short)

    def stage(self, rows: Mapping[str, DataFrame | list[str]], barrier: int) -> None:
        """Put each source's ``rows`` of ``barrier`` in the barrier's folder (a frame written, a
        list of data files copied), named when all are there (once): two sources staged one by
        one would make two micro-batches, each with its planning, logs and state commit."""
        assert self.folder is not None
        staged = f"{self.folder}/staged/b{barrier}"
        if self.storage.exists(staged):
            return  # staged before a crash
        writing = f"{self.folder}/staged/_b{barrier}"
        self.storage.delete(writing)  # (a staging that a crash cut short)
        self.storage.make_folder(writing)  # (sources that added no file put none in it)
        for source, found in rows.items():
            if isinstance(found, DataFrame):
                found.write.mode("overwrite").parquet(f"{writing}/{source}")
            else:
                for file in found:
                    self.storage.copy(file, f"{writing}/{source}/{file.rsplit('/', 1)[1]}")
        if not self.storage.rename(writing, staged):
            raise OSError(f"could not rename {writing} to {staged}")

    def run(self, schemas: Callable[[], Mapping[str, StructType]], query: Callable[[SparkSession], str],
            watch: Stopwatch) -> None:
        """Let the query process what is staged; if it is not running, start it on the state's
        checkpoint: ``query`` makes its SQL over the sources of ``schemas`` (their staged rows'
        schemas), each with ``BARRIER``."""
        self._run_batch(self._running(schemas, query), watch)

    def output(self, barrier: int) -> DataFrame:
        """The rows the query made for ``barrier`` (with their ``BARRIER``)."""
        assert self.folder is not None and self.schema is not None
        out = f"{self.folder}/out"
        batches = [f"{out}/{n}" for n in self.storage.names(out) if not n.startswith(("_", "."))]
        schema = StructType([*self.schema.fields, StructField(BARRIER, LongType())])
        if not batches:
            return self.spark.createDataFrame([], schema)
        return self.spark.read.schema(schema).parquet(*batches).where(F.col(BARRIER) == barrier)

    def finish(self) -> None:
        """The barrier is committed: delete what it staged and made, and the states before this
        one (at every barrier: a stopped query's state store may still write its last snapshot
        in the background, making a deleted folder again)."""
        if self.folder is not None:
            for made in ("out", "staged"):
                for name in self.storage.names(f"{self.folder}/{made}"):
                    self.storage.delete(f"{self.folder}/{made}/{name}")
        for name in self.storage.names(self.home):
            if f"{self.home}/{name}" != self.folder:
                self.storage.delete(f"{self.home}/{name}")

    def _running(self, schemas: Callable[[], Mapping[str, StructType]],
                 query: Callable[[SparkSession], str]) -> StreamingQuery:
        if self.query is not None and self.query.isActive:
            return self.query
        assert self.folder is not None
        if self._session is None:
            self._session = self.spark.newSession()  # its temp views are the streams, not the snapshots
            self._session.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
            self._session.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
            # a snapshot after every batch (uploaded in the background): a restart loads it, rather
            # than replaying the changelogs since the last one (the bootstrap's held every row: 104 s at 10M)
            self._session.conf.set("spark.sql.streaming.stateStore.minDeltasForSnapshot", "1")
        for source, schema in schemas().items():
            stream = (self._session.readStream.schema(schema).option("maxFilesPerTrigger", 1 << 30)
                      .parquet(f"{self.folder}/staged/b*/{source}"))
            staged = F.regexp_extract(F.col("_metadata.file_path"), r"/staged/b([0-9]+)/[^/]+/[^/]+$", 1)
            stream.withColumn(BARRIER, staged.cast("long")).createOrReplaceTempView(source)
        frame = self._session.sql(query(self._session))
        self.schema = StructType([f for f in frame.schema.fields if f.name != BARRIER])
        out, keep_first = f"{self.folder}/out", self.keep_first

        def batch(rows: DataFrame, batch_id: int) -> None:  # rewritten whole if the batch is run again
            if batch_id == 0 and not keep_first:
                rows.write.format("noop").mode("overwrite").save()  # (run for its state only)
            else:
                rows.write.mode("overwrite").parquet(f"{out}/b{batch_id}")

        self.query = (frame.writeStream.queryName(self.name).foreachBatch(batch).outputMode(self.mode)
                      .option("checkpointLocation", f"{self.folder}/checkpoint").trigger(processingTime=TRIGGER).start())
        return self.query

    def _run_batch(self, query: StreamingQuery, watch: Stopwatch) -> None:
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
        at_once = max(1, self.spark.sparkContext.defaultParallelism)
        commit = min(batch, sum(o.get("commitTimeMs", 0) / min(at_once, max(1, o.get("numShufflePartitions", 1)))
                                for p in ran for o in p["stateOperators"]))
        watch.add("state work", batch - commit)
        watch.add("state commit", commit)
        watch.add("stream", max(triggers - batch, 0))
        watch.add("wait", max(spent - triggers, 0))  # (a trigger's time includes its batch's)
