"""One Delta commit per barrier, idempotent, and the completion that announces it.

Every write a job makes for barrier ``b`` carries ``txnAppId = "<job>#g<generation>"``,
``txnVersion = b`` and ``userMetadata = {"barrier": b, "job": ..., "generation": g, "table_id":
...}``. Replaying the barrier after a crash is then a no-op in Delta, and the version that holds
barrier ``b`` is found again from the table history. The table id (``TableState.table_id``) says
which table of that name made the commit: a sink refuses a folder whose commits name another
(``ForeignState``), since its marks would make this table's barriers look done already.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from confluent_kafka import Producer
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from coordinator.client.clock import now_ms
from coordinator.client.delivery import Delivered
from coordinator.client.topics import Topics
from coordinator.codec import default_codec
from coordinator.domain import BarrierCompleted, OffsetRange, PhaseTime, SourceVersion, entity_key
from coordinator.domain.errors import ForeignState
from coordinator.faults import crash_point, fires_once
from coordinator.settings import CrashAt, Settings
from spark_jobs.runtime.catalog import register_table
from spark_jobs.runtime.delta_log import align_log_retention, delta_log, newest_commit, parse_metadata, prepare_next_write
from spark_jobs.runtime.delta_txn import ALREADY, Fallback, Mark, commit_directly
from spark_jobs.runtime.job_metrics import job_metrics
from spark_jobs.runtime.session import session_conf, spark_error
from spark_jobs.runtime.stopwatch import Stopwatch
from spark_jobs.runtime.storage import Storage

log = logging.getLogger(__name__)


def barrier_txn(spark: SparkSession, app_id: str, barrier: int, metadata: str,
                extra: dict[str, str] | None = None) -> AbstractContextManager[None]:
    """Session settings that make DML (MERGE, overwrite via SQL) idempotent for one barrier."""
    return session_conf(spark, {
        "spark.databricks.delta.write.txnAppId": app_id,
        "spark.databricks.delta.write.txnVersion": str(barrier),
        "spark.databricks.delta.commitInfo.userMetadata": metadata,
        **(extra or {}),
    })


# A sink checkpoints its log itself, between barriers, every CHECKPOINT_EVERY commits; Delta's
# own checkpoint (written inside the commit that reaches its interval) would then only add time
# to a barrier, so its interval is set out of the way.
CHECKPOINT_EVERY = 25  # each costs a reconstruction and two Spark jobs; the log between them stays a few kB
# A table committed directly (``delta_txn``) rebuilds no state between checkpoints, so it checkpoints
# less often: a reader replays at most this many commits' JSON on top of the checkpoint.
DIRECT_CHECKPOINT_EVERY = 100
TABLE_PROPERTIES = {"delta.enableChangeDataFeed": "true", "delta.checkpointInterval": "100000"}
# A table created by its first write gets these properties from the session defaults.
NEW_TABLE_DEFAULTS = {f"spark.databricks.delta.properties.defaults.{k.removeprefix('delta.')}": v
                      for k, v in TABLE_PROPERTIES.items()}


class Write(NamedTuple):
    """A barrier's write as a value, which ``DeltaSink.commit`` runs under the barrier's txn:
    ``frame`` appended, overwriting the table (writer ``options``), or MERGEd by ``key``
    (``merge_by_key``: ``columns`` set, ``delete_flag`` rows deleted, ``target`` the files it may
    touch). ``one_task``: its shuffles in one task each (a small table into one file).

    Example::

        sink.commit(barrier, generation, Write("merge", changes, key=["k"], columns=["k", "v"]))
    """

    mode: str  # "append", "overwrite" or "merge"
    frame: DataFrame
    options: Mapping[str, str] = {}
    key: Sequence[str] = ()
    columns: Sequence[str] = ()
    delete_flag: str | None = None
    target: Column | None = None
    one_task: bool = False


@dataclass
class DeltaSink:
    """A job's sink table: creation, barrier-stamped writes, and barrier -> version lookup.

    With ``create_on_first_write`` (CREATE TABLE AS SELECT) nothing is created up front: the
    first barrier's write creates the table, so its version 0 already holds that barrier's
    rows and a job that fails before it leaves no table behind."""

    spark: SparkSession
    path: str
    job_id: str
    schema: str | StructType | None  # DDL ("a BIGINT, b STRING") or a Spark schema; None: from the first write
    create_on_first_write: bool = False
    crash_at: CrashAt | None = None  # drills only (LOCKSTEP_CRASH_AT)
    compact_every: int = 0  # compact the table's small files after every this many commits (0: never)
    name: str | None = None  # the table's name in a Hive metastore, registered once the table exists
    lazy_history: bool = False  # read the table's history at first need, not at start (dead letters: rarely)
    table_id: str = ""  # the coordinator's id of the table this sink writes (TableState.table_id; "": unchecked)
    versions: dict[tuple[int, int], int] = field(default_factory=dict)  # (generation, barrier) -> version
    # (generation, barrier) -> the source versions an intermediate job read for that commit
    sources: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)
    # (generation, barrier) -> fingerprint of the query that computed that commit
    queries: dict[tuple[int, int], str] = field(default_factory=dict)
    # (generation, barrier) -> what the job had measured of its ways to a barrier (``costs.CostChoice``)
    costs: dict[tuple[int, int], dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.written = False  # whether the last ``commit`` ran its write (else Delta had it already)
        self._mark: Mark | None = None  # the barrier ``commit`` is writing, for ``append`` and ``overwrite``
        self._direct: int | None = None  # the version a direct commit of it made (``ALREADY``: the table had it)
        self._fallbacks: set[str] = set()  # why barriers went through Delta's writer, said once each
        self._log: Any = None  # the table's DeltaLog, once the table exists (``delta_log.delta_log``)
        # the upkeep's Spark jobs go to the job's own scheduler pool: in the shared default pool they
        # waited behind other jobs' upkeep and checkpoints, and the next barrier waited for them
        self._upkeep = ThreadPoolExecutor(1, thread_name_prefix=f"upkeep-{self.job_id}", initializer=lambda: (
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.job_id)))
        self._upkeep_done: Future[None] | None = None
        self._commits = 0
        self._history_loaded = False
        self._clear_unfinished_create()
        self.exists = DeltaTable.isDeltaTable(self.spark, self.path)
        if not self.exists and not self.create_on_first_write:
            schema = self.spark.createDataFrame([], self.schema).schema
            builder = DeltaTable.createIfNotExists(self.spark).location(self.path).addColumns(schema)
            for key, value in TABLE_PROPERTIES.items():
                builder = builder.property(key, value)
            builder.execute()
            self.exists = True
            self._history_loaded = True
        if self.exists:
            self._register()
            if not self.lazy_history:
                self.ensure_history()
            self._upkeep_done = self._upkeep.submit(align_log_retention, self.spark, self.path)

    def _register(self) -> None:
        """Name the table in the metastore, if there is one; the data does not wait for a
        metastore that fails (the next start of the job registers it)."""
        if self.name is None:
            return
        try:
            register_table(self.spark, self.name, self.path)
        except Exception as exc:  # noqa: BLE001 - a name is a convenience; the barrier's data is what counts
            log.warning("could not register table %s in the metastore (the job's next start tries again): %s",
                        self.name, spark_error(exc))

    def _clear_unfinished_create(self) -> None:
        """A process killed while creating the table can leave a ``_delta_log`` without any
        commit, which Delta then refuses to create a table in. Nothing was committed, so it goes."""
        storage, log = Storage(self.spark), f"{self.path.rstrip('/')}/_delta_log"
        if storage.is_dir(log) and not any(n.endswith(".json") or ".checkpoint" in n for n in storage.names(log)):
            storage.delete(log)

    def _load_history(self) -> None:
        owners: dict[str, int] = {}  # table id -> the newest version that carries it
        for row in DeltaTable.forPath(self.spark, self.path).history().select("version", "userMetadata").collect():
            meta = parse_metadata(row["userMetadata"])
            if meta.get("table_id"):
                owners[str(meta["table_id"])] = max(owners.get(str(meta["table_id"]), -1), int(row["version"]))
            if meta.get("job") == self.job_id:
                at = (int(meta["generation"]), int(meta["barrier"]))
                self.versions[at] = int(row["version"])
                if "sources" in meta:
                    self.sources[at] = {str(k): int(v) for k, v in meta["sources"].items()}
                if "query" in meta:
                    self.queries[at] = str(meta["query"])
                if isinstance(meta.get("costs"), dict):
                    self.costs[at] = {str(k): float(v) for k, v in meta["costs"].items()}
        self._history_loaded = True
        foreign = {owner: v for owner, v in owners.items() if self.table_id and owner != self.table_id}
        if foreign:
            owner, version = max(foreign.items(), key=lambda item: item[1])
            raise ForeignState(
                f"{self.path} holds another table {self.name or ''} (table id {owner}, up to version {version}), "
                f"not the one the coordinator knows (table id {self.table_id}): a table of the same name from "
                "another pipeline (another LOCKSTEP_TOPIC_PREFIX or coordinator) or from before it was dropped. "
                "Nothing was written. Keep both: set another LOCKSTEP_WAREHOUSE; or, if that data is not "
                "wanted, `lockstep drop` it in its own pipeline or delete the folder, then run again")

    def ensure_history(self) -> None:
        """Read the table's history if it exists and was not read yet (``lazy_history``)."""
        if self.exists and not self._history_loaded:
            self._load_history()

    def last_commit(self, generation: int, before: int) -> tuple[int, int] | None:
        """(barrier, version) of this generation's newest commit for a barrier before ``before``."""
        self.ensure_history()
        done = [(b, v) for (g, b), v in self.versions.items() if g == generation and b < before]
        return max(done, default=None)

    def app_id(self, generation: int) -> str:
        return f"{self.job_id}#g{generation}"

    def metadata(self, barrier: int, generation: int, sources: dict[str, int] | None = None,
                 query: str | None = None, costs: dict[str, float] | None = None, layout: str | None = None) -> str:
        meta: dict[str, object] = {"barrier": barrier, "job": self.job_id, "generation": generation}
        if self.table_id:
            meta["table_id"] = self.table_id
        if sources is not None:
            meta["sources"] = sources
        if query is not None:
            meta["query"] = query
        if costs:
            meta["costs"] = costs
        if layout:
            meta["layout"] = layout
        return json.dumps(meta)

    def version_at(self, barrier: int, generation: int) -> int:
        """The version holding ``barrier`` when this job made no commit for it: its newest
        commit for an earlier barrier, or the table's first version."""
        self.ensure_history()
        earlier = [v for (g, b), v in self.versions.items() if b <= barrier and g <= generation]
        return max(earlier, default=0)

    def restore(self, barrier: int, generation: int, version: int | None) -> None:
        """Make the table what it was at ``version`` (None: empty) as ``generation``'s state at
        ``barrier``: where a revised root job starts over. Once per generation: a commit of the
        generation (this restore included) means it was done."""
        self.ensure_history()
        if any(g == generation for g, _ in self.versions) or not self.exists:
            return
        where = f"delta.`{self.path}`"
        with barrier_txn(self.spark, self.app_id(generation), barrier, self.metadata(barrier, generation)):
            self.spark.sql(f"DELETE FROM {where}" if version is None else f"RESTORE TABLE {where} TO VERSION AS OF {version}")
        self._load_history()

    def commit(self, barrier: int, generation: int, write: Write | Callable[[], None],
               sources: dict[str, int] | None = None, query: str | None = None,
               watch: Stopwatch | None = None, costs: dict[str, float] | None = None, layout: str | None = None) -> int:
        """Run ``write`` (a ``Write``, or a function that calls ``append`` or ``overwrite``) under
        the barrier's txn; return the version that holds the barrier.
        ``sources`` (an intermediate job's source versions), ``query`` (a fingerprint of its
        query) and ``costs`` (what it measured of its ways to a barrier) are kept in the commit's
        metadata, so a restarted job knows what its table reflects and what each way cost;
        ``layout`` says what a changelog table's commit did (``delta_log.COMPACTED``), for its readers.
        ``watch`` times the phases: upkeep (waiting for the last one), write, lookup."""
        self.written = False
        self.ensure_history()
        known = self.versions.get((generation, barrier))
        if known is not None:
            return known  # committed before a crash: Delta would skip the write anyway
        crash_point("before_commit", self.crash_at)
        if fires_once("hang_before_commit", self.crash_at):  # drills: a Spark action that never ends
            self.spark.sql("SELECT java_method('java.lang.Thread', 'sleep', 3600000L)").collect()
        watch = watch or Stopwatch()
        with watch.phase("upkeep"):
            self._finish_upkeep()
        metadata = self.metadata(barrier, generation, sources, query, costs, layout)
        self._mark, self._direct = Mark(self.app_id(generation), barrier, metadata), None
        try:
            with watch.phase("write"), barrier_txn(self.spark, self.app_id(generation), barrier, metadata,
                                                   None if self.exists else NEW_TABLE_DEFAULTS):
                self._run(write) if isinstance(write, Write) else write()
        finally:
            self._mark = None
        if not self.exists:
            self.exists = True
            self._history_loaded = True  # made by this write: its history is this commit, recorded below
            self._register()
        if self._direct == ALREADY:
            meta = {}  # the table's mark held the barrier: found in its history below
        elif self._direct is not None:
            version, meta = self._direct, {"job": self.job_id, "barrier": barrier, "generation": generation}
        else:
            with watch.phase("lookup"):
                version, meta = newest_commit(self.spark, self.path)
        if (meta.get("job"), meta.get("barrier"), meta.get("generation")) == (self.job_id, barrier, generation):
            self.written = True
            self._commits += 1
            compact = self.compact_every > 0 and self._commits % self.compact_every == 0
            direct = self._direct is not None
            self._upkeep_done = self._upkeep.submit(
                prepare_next_write, self.spark, self.path, self._commits % (DIRECT_CHECKPOINT_EVERY if direct else
                                                                            CHECKPOINT_EVERY) == 0, compact,
                rebuild=not direct)
            self.versions[(generation, barrier)] = version
            if sources is not None:
                self.sources[(generation, barrier)] = dict(sources)
            if query is not None:
                self.queries[(generation, barrier)] = query
            if costs:
                self.costs[(generation, barrier)] = dict(costs)
            return version
        self._load_history()  # the write was a no-op: find the version of the earlier commit
        return self.versions.get((generation, barrier), self.version_at(barrier, generation))

    def _run(self, write: Write) -> None:
        with session_conf(self.spark, {"spark.sql.shuffle.partitions": "1"} if write.one_task else {}):
            if write.mode == "append":
                self.append(write.frame)
            elif write.mode == "overwrite":
                self.overwrite(write.frame, write.options)
            else:
                merge_by_key(self.spark, self.path, write.frame, write.key, write.columns, write.delete_flag,
                             null_safe=True, target=write.target)

    def append(self, frame: DataFrame) -> None:
        """Append ``frame`` as the barrier's write: call it from the ``write`` that ``commit``
        runs. Committed directly (``delta_txn``: no rebuild of the table's state) where it can
        be, else by Delta's writer under the barrier's txn mark."""
        if not self._direct_write(frame, "append", {}):
            frame.write.format("delta").mode("append").save(self.path)

    def overwrite(self, frame: DataFrame, options: Mapping[str, str] | None = None) -> None:
        """Replace the table's rows with ``frame`` as the barrier's write (as ``append``);
        ``options``: the writer's (``maxRecordsPerFile``)."""
        if not self._direct_write(frame, "overwrite", options or {}):
            writer = frame.write.format("delta").mode("overwrite")
            for key, value in (options or {}).items():
                writer = writer.option(key, value)
            writer.save(self.path)

    def _direct_write(self, frame: DataFrame, mode: str, options: Mapping[str, str]) -> bool:
        """Commit the barrier directly (``delta_txn.commit_directly``); False where Delta's
        writer must do it (said once per reason)."""
        if self._mark is None or not self.exists:
            return False
        if self._log is None:
            self._log = delta_log(self.spark, self.path)
        done = commit_directly(self.spark, self._log, frame, mode, self._mark, options,
                               before_commit=self._drill_after_write_files if self.crash_at else None)
        if isinstance(done, Fallback):
            if done.reason not in self._fallbacks:
                self._fallbacks.add(done.reason)
                log.warning("table %s: barriers go through Delta's writer, which rebuilds the table's state "
                            "for each, while %s (said once)", self.name or self.path, done.reason)
            return False
        self._direct = done
        return True

    def _drill_after_write_files(self) -> None:
        crash_point("after_write_files", self.crash_at)

    def close(self) -> None:
        """Let the upkeep after the last commit finish and end its thread: once a job's query has
        stopped, nothing of it runs in Spark any more (a session stopped under it would log
        its cut-off tasks)."""
        self._finish_upkeep()
        self._upkeep.shutdown(wait=True)

    def _finish_upkeep(self) -> None:
        """Wait for the upkeep after the last commit (so this write finds its work done); a
        failed upkeep only costs time: the write does that work itself then."""
        if self._upkeep_done is None:
            return
        try:
            self._upkeep_done.result()
        except Exception as exc:  # noqa: BLE001 - upkeep is an optimisation; the write is what counts
            log.warning("upkeep of %s after its last commit failed (the next write redoes it): %s", self.path,
                        spark_error(exc))
        self._upkeep_done = None


def merge_by_key(spark: SparkSession, path: str, rows: DataFrame, key: Sequence[str], columns: Sequence[str],
                 delete_flag: str | None = None, null_safe: bool = False, target: Column | None = None) -> None:
    """Upsert ``rows`` into the Delta table at ``path`` by ``key``; rows whose boolean column
    ``delete_flag`` is true delete their key instead. ``null_safe`` matches NULL keys too.
    ``target``, a condition on the table's rows (alias ``t``) true wherever ``rows`` may match,
    lets Delta skip the files it rules out (``pruning.within``)."""
    equal = "<=>" if null_safe else "="
    values = {f"`{c}`": f"s.`{c}`" for c in columns}
    condition = F.expr(" AND ".join(f"t.`{k}` {equal} s.`{k}`" for k in key))
    merge = DeltaTable.forPath(spark, path).alias("t").merge(
        rows.alias("s"), condition if target is None else condition & target)
    if delete_flag is None:
        merge = merge.whenMatchedUpdate(set=values).whenNotMatchedInsert(values=values)
    else:
        merge = (merge.whenMatchedDelete(condition=f"s.`{delete_flag}`").whenMatchedUpdate(set=values)
                 .whenNotMatchedInsert(condition=f"NOT s.`{delete_flag}`", values=values))
    merge.execute()


class CompletionPublisher:
    """Publishes BarrierCompleted facts (after the Delta commit, never before). ``fused_with``
    names the leader of the fused group that runs the job, if it is a member of one."""

    def __init__(self, settings: Settings) -> None:
        self.fused_with = ""
        self.topic = Topics(settings.topic_prefix).completions
        self.crash_at = settings.crash_at
        self.codec = default_codec(settings.schemas)
        self.producer: Producer | None = Producer(settings.kafka_config({"enable.idempotence": True, "linger.ms": 0},
                                                                    client="lockstep-completions"))

    def close(self) -> None:
        """Let go of the producer (librdkafka closes its connections once it is freed), so a
        stopped job leaves no client behind that outlives the broker."""
        if self.producer is not None:
            self.producer.flush(10)
            self.producer = None

    def publish(
        self,
        job_id: str,
        table: str,
        barrier: int,
        generation: int,
        version: int,
        started_at_ms: int,
        rows: tuple[int, int, int] = (0, 0, 0),
        source_versions: dict[str, int] | None = None,
        offsets: Sequence[OffsetRange] = (),
        phases: Sequence[PhaseTime] = (),
    ) -> BarrierCompleted:
        crash_point("before_completion", self.crash_at)
        fact = BarrierCompleted(
            job_id, table, barrier, generation, version, rows[0], rows[1], rows[2],
            tuple(SourceVersion(t, v) for t, v in sorted((source_versions or {}).items())),
            tuple(offsets),
            started_at_ms, now_ms(), tuple(phases), self.fused_with,
        )
        if self.producer is None:
            raise RuntimeError(f"the completion publisher of {table} is closed (its job stopped)")
        delivered = Delivered()  # flush() also returns 0 when the broker refused the record
        self.producer.produce(self.topic, key=entity_key(fact).encode(), value=self.codec.encode(fact), on_delivery=delivered)
        if self.producer.flush(30) != 0 or delivered.errors:
            raise RuntimeError(f"could not publish the completion of {table}@{barrier} to {self.topic}: "
                               f"{'; '.join(delivered.errors) or 'not delivered within 30 s'}")
        job_metrics.committed(fact)
        return fact
