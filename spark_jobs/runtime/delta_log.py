"""Light reads of a Delta table's log through the DeltaLog this Spark application already holds,
and the log upkeep a job does between barriers.

A job needs two facts after each barrier's write: the version the write made, and the
metadata stamped on that commit. ``DeltaTable.history(1)`` answers both with a Spark job
(0.1-0.4 s each time); the DeltaLog's in-memory snapshot and one read of the commit file
answer them in milliseconds. No data is read here: data always goes through Spark.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple
from urllib.parse import unquote

from delta.tables import DeltaTable
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from coordinator.domain.snapshot import APPENDED, BARRIER, HIDDEN, ROW_KEY, is_changelog
from spark_jobs.runtime.java import none, static
from spark_jobs.runtime.session import LOG_RETENTION_DEFAULT
from spark_jobs.runtime.storage import Storage

APPENDED_VERSIONS = 20  # the most versions ``appended_files`` reads one by one (a job far behind reads the feed)
APPEND_ACTIONS = ("commitInfo", "txn")  # what an append's commit holds beside its added files
COMPACTED = "compacted"  # a changelog table's compaction, as its commit's metadata says ("layout")
# A read of at most this many bytes of files is one partition (``read_files``): a barrier over
# small inputs is then one Spark stage of one task, where shuffles made it four stages of five
# tasks, each a round of scheduling, task serialization and shuffle files on the driver (a
# sibling aggregate's barrier: 0.64 -> 0.50 core-s, ``bench.siblings``). About 100,000 narrow
# rows: one task's work of tens of milliseconds, so a larger read (or a costly Python function
# over one) keeps Spark's split and its parallel tasks.
ONE_TASK_BYTES = 1 << 20


class DataFiles(NamedTuple):
    """Data files of a table to read (``read_files(spark, *found)``): whole paths, the table's
    schema (JSON) and the files' bytes, as the log records them."""

    paths: list[str]
    schema_json: str
    size: int | None


def total_size(sizes: list[Any]) -> int | None:
    """The bytes of files whose log entries gave ``sizes``; None if one did not say.

    >>> total_size([10, 20]), total_size([10, None]), total_size([])
    (30, None, 0)
    """
    return sum(sizes) if all(isinstance(s, int) for s in sizes) else None


def delta_log(spark: SparkSession, path: str) -> Any:
    """The table's ``DeltaLog`` (keep it where it is used often: each look-up makes a Hadoop
    configuration)."""
    return static(spark, "org.apache.spark.sql.delta.DeltaLog", "forTable")(spark._jsparkSession, path)


def newest_commit(spark: SparkSession, path: str) -> tuple[int, dict[str, Any]]:
    """(version, userMetadata parsed as a JSON object) of the newest commit this application
    knows of the table at ``path``: right after a write through ``spark``, the commit that
    write made (a write Delta skipped as already done leaves the commit before it)."""
    log = delta_log(spark, path)
    version = int(log.unsafeVolatileSnapshot().version())
    delta_file = static(spark, "org.apache.spark.sql.delta.util.FileNames", "unsafeDeltaFile")(log.logPath(), version)
    info = static(spark, "org.apache.spark.sql.delta.DeltaHistoryManager", "getCommitInfoOpt")(
        log.store(), delta_file, log.newDeltaHadoopConf())
    raw = info.get().userMetadata() if info.isDefined() else None
    return version, parse_metadata(raw.get() if raw is not None and raw.isDefined() else None)


def latest_version(spark: SparkSession, path: str) -> int:
    """The newest version of the table at ``path`` now, from a listing of its log (no state is
    reconstructed); -1 if the table has no commit yet."""
    return int(delta_log(spark, path).update(False, none(spark), none(spark)).version())


def table_bytes(spark: SparkSession, path: str) -> int:
    """Size of the table's current files, from the snapshot this application holds: its
    checksum file says it (asking the snapshot itself would reconstruct its state)."""
    snapshot = delta_log(spark, path).unsafeVolatileSnapshot()
    checksum = snapshot.checksumOpt()
    return int(checksum.get().tableSizeBytes() if checksum.isDefined() else snapshot.sizeInBytes())


def align_log_retention(spark: SparkSession, path: str) -> None:
    """Give a table created before the session's log retention was set (or with another one)
    that retention; the sink calls this in its upkeep slot, where no write of its own races it."""
    wanted = spark.conf.get(LOG_RETENTION_DEFAULT, None)
    configuration = delta_log(spark, path).unsafeVolatileSnapshot().metadata().configuration()
    current = configuration.get("delta.logRetentionDuration")
    if wanted and (not current.isDefined() or current.get() != wanted):
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.logRetentionDuration' = '{wanted}', "
                  f"'delta.deletedFileRetentionDuration' = '{wanted}')")


def prepare_next_write(spark: SparkSession, path: str, checkpoint: bool, compact: bool = False,
                       rebuild: bool = True) -> None:
    """Work for the next write, done while the job waits for its next barrier: if ``compact``,
    OPTIMIZE's bin-packing of the small files each barrier adds (a commit that changes no data:
    every exact point keeps reading the versions it names, and change-data readers skip it); if
    ``rebuild`` (the table's writes go through Delta's writer, not ``delta_txn``), the state of
    the table's newest snapshot, where Delta's writer looks up the txn marks (``txnAppId``) and
    the files a write replaces (a few Spark jobs per new version); and, if ``checkpoint``, a
    checkpoint of the log (which Delta would otherwise write inside every 10th commit)."""
    if compact:
        DeltaTable.forPath(spark, path).optimize().executeCompaction()
    log = delta_log(spark, path)
    snapshot = log.unsafeVolatileSnapshot()
    if rebuild:
        snapshot.transactions()
    if checkpoint:
        log.checkpointAndCleanUpDeltaLog(snapshot, none(spark))
        if rebuild:
            # the next write's update() sees the new checkpoint and loads a new snapshot: load it and
            # reconstruct its state now, or that write pays for it on the barrier's path
            log.update(False, none(spark), none(spark)).transactions()


def parse_metadata(raw: str | None) -> dict[str, Any]:
    """A commit's userMetadata as a dict ({} if absent or not a JSON object).

    >>> parse_metadata('{"barrier": 3}'), parse_metadata("not json"), parse_metadata(None)
    ({'barrier': 3}, {}, {})
    """
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def version_files(spark: SparkSession, path: str, version: int) -> DataFiles | None:
    """The data files that make up ``version`` of the table at ``path`` and its schema (JSON),
    from that version's checksum file, which Delta writes with every commit and which lists the
    files of a table of up to 50 of them. None where that is not enough to read the version as
    Delta would (no checksum or no file list in it, deletion vectors, partition columns, column
    mapping): the caller then asks Delta, whose time travel first reconstructs the version's
    state with several Spark jobs (0.5-0.9 s a table on this machine, against ~0.1 s this way)."""
    checksum = _checksum(spark, path, version)
    if not isinstance(checksum.get("allFiles"), list) or not _plain(checksum.get("metadata")):
        return None
    files, sizes = [], []
    for add in checksum["allFiles"]:
        if add.get("deletionVector"):
            return None
        files.append(data_file(path, unquote(add["path"])))
        sizes.append(add.get("size"))
    return DataFiles(files, checksum["metadata"]["schemaString"], total_size(sizes))


def log_file(spark: SparkSession, path: str, name: str) -> list[dict[str, Any]] | None:
    """The JSON objects (one per line) of the file ``name`` in the table's ``_delta_log`` (a
    commit, ``00000000000000000007.json``, or a checksum, ``.crc``), read in one go through
    Hadoop's file system (any store Spark reads) and parsed here: asking Delta's parsed actions
    field by field costs a Py4J round trip each, ~50 ms for a checksum of 40 files. None if the
    file is missing; a file that cannot be read or parsed raises (``Py4JJavaError``, ``ValueError``)."""
    text = Storage(spark).read_text(f"{path.rstrip('/')}/_delta_log/{name}")
    return None if text is None else [json.loads(line) for line in text.splitlines() if line.strip()]


def _log_json(spark: SparkSession, path: str, name: str) -> list[dict[str, Any]] | None:
    """``log_file``, or None where it raises: the light reads then leave the version to Delta."""
    try:
        return log_file(spark, path, name)
    except (Py4JJavaError, ValueError):
        return None


def _checksum(spark: SparkSession, path: str, version: int) -> dict[str, Any]:
    """``version``'s checksum (its one JSON object), or {} where it cannot be read."""
    found = _log_json(spark, path, f"{version:020d}.crc")
    return found[0] if found and isinstance(found[0], dict) else {}


def _plain(metadata: Any) -> bool:
    """Whether a table's files hold its rows as they are, by its metadata action (JSON): no
    partition values kept in the log, no column names mapped to other physical names."""
    return (isinstance(metadata, dict) and not metadata.get("partitionColumns")
            and "delta.columnMapping.mode" not in (metadata.get("configuration") or {}))


def data_file(table: str, file: str) -> str:
    """A data file's path as the log states it (relative to the table, or a full URI) made whole.

    >>> data_file("/w/t/", "part-0.parquet"), data_file("/w/t", "s3a://b/t/part-0.parquet")
    ('/w/t/part-0.parquet', 's3a://b/t/part-0.parquet')
    """
    return file if "://" in file or file.startswith("/") else f"{table.rstrip('/')}/{file}"


def read_version(spark: SparkSession, path: str, version: int | None) -> DataFrame:
    """The table at ``path`` as of ``version`` (None: its latest), read by Spark, as its readers
    see it (a changelog table: each key's newest row). Every read of a table at a version goes
    through here, so it costs one Spark job wherever the version's checksum lists its files
    (``version_files``), and Delta's time travel otherwise."""
    found = version_files(spark, path, version) if version is not None else None
    if found is None:
        reader = spark.read.format("delta")
        frame = (reader if version is None else reader.option("versionAsOf", version)).load(path)
    else:
        frame = read_files(spark, *found)
    return latest_rows(frame) if is_changelog(frame.columns) else frame


def latest_rows(frame: DataFrame) -> DataFrame:
    """A changelog table's rows as readers see them (``coordinator.domain.snapshot.latest_rows_sql``):
    each key's appended row of the newest barrier, else its compacted row. The appended keys are
    broadcast (few: compaction keeps them under a tenth of the table), so the compacted rows are
    probed, not sorted; Spark's estimate (the whole table's size) would sort them all."""
    rank = f"{HIDDEN}rank"
    appended = frame.where(F.col(APPENDED))
    newest = Window.partitionBy(ROW_KEY).orderBy(F.col(BARRIER).desc())
    latest = appended.withColumn(rank, F.row_number().over(newest)).where(F.col(rank) == 1).drop(rank)
    kept = frame.where(~F.col(APPENDED)).join(F.broadcast(appended.select(ROW_KEY)), ROW_KEY, "left_anti")
    return kept.unionByName(latest)


def read_files(spark: SparkSession, files: list[str], schema_json: str, size: int | None = None) -> DataFrame:
    """The rows of a Delta table's data ``files`` (whole paths), read with its schema (JSON); in
    one partition where their ``size`` is known to be at most ``ONE_TASK_BYTES``, so the
    aggregates and joins over it need no shuffle (one partition is already grouped by any key)."""
    schema = StructType.fromJson(json.loads(schema_json))
    if not files:
        return spark.createDataFrame([], schema)
    frame = spark.read.schema(schema).parquet(*files)
    return frame.coalesce(1) if size is not None and size <= ONE_TASK_BYTES else frame


CHANGE_FEED_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def change_feed(spark: SparkSession, path: str, old: int, new: int, weight: str) -> DataFrame:
    """Delta's change data feed of the table at ``path``, versions ``(old, new]``: each row
    inserted or updated to with ``weight`` +1, deleted or updated from with -1."""
    # read as the path identifier delta.`path`: `.load(path)` passes the options to Delta twice
    # (their given and lower-case spellings) and Spark warns three times a read
    quoted = path.replace("`", "``")
    feed = (spark.read.option("readChangeFeed", "true").option("startingVersion", old + 1)
            .option("endingVersion", new).table(f"delta.`{quoted}`"))
    sign = F.when(F.col("_change_type").isin("insert", "update_postimage"), 1).otherwise(-1)
    return feed.withColumn(weight, sign).drop(*CHANGE_FEED_COLUMNS)


def changed_rows(spark: SparkSession, path: str, old: int, new: int, weight: str) -> DataFrame:
    """The rows versions ``(old, new]`` of the table at ``path`` changed, with ``weight``: read
    from the files they added where they only appended (``appended_files``: all +1), else
    from the change data feed (``change_feed``)."""
    appended = appended_files(spark, path, old, new)
    if appended is None:
        return change_feed(spark, path, old, new, weight)
    return read_files(spark, *appended).withColumn(weight, F.lit(1))


def appended_files(spark: SparkSession, path: str, old: int, new: int) -> DataFiles | None:
    """The data files that versions ``(old, new]`` of the table at ``path`` added, and its schema
    at ``new``, if those versions only added files (appends: no file removed, no change-data
    file, no new schema, no deletion vector), read from their commit files (``_log_json``).
    Their rows are then exactly what Delta's change data feed returns as inserts, which costs
    ~45 ms more a read (it resolves the snapshots at both ends first; ``bench.spark_jobs
    changes``). None where that does not hold, or for more than ``APPENDED_VERSIONS`` versions:
    the caller reads the change data feed."""
    if not 0 < new - old <= APPENDED_VERSIONS:
        return None
    checksum = _checksum(spark, path, new)
    if not _plain(checksum.get("metadata")):
        return None
    files, sizes = [], []
    for version in range(old + 1, new + 1):
        actions = _log_json(spark, path, f"{version:020d}.json")
        if actions is None:  # a commit file gone (log cleanup): the feed fails with Delta's own message
            return None
        for action in actions:
            ((kind, value),) = action.items()
            if kind == "add" and value.get("dataChange") and not value.get("deletionVector"):
                files.append(data_file(path, unquote(value["path"])))
                sizes.append(value.get("size"))
            elif kind not in APPEND_ACTIONS:
                return None
    return DataFiles(files, checksum["metadata"]["schemaString"], total_size(sizes))


def changelog_appended_files(spark: SparkSession, path: str, old: int,
                             new: int) -> tuple[list[str], str, bool] | None:
    """The data files of a changelog table that its versions ``(old, new]`` added, among which
    are the rows they appended (``APPENDED``), its schema at ``new``, and whether no version
    compacted (then the files hold just the appended rows): where each version appended rows,
    compacted the table (its commit says so; a compaction keeps its own barrier's rows appended)
    or changed no data (OPTIMIZE). None otherwise (a rebuild, a new schema, a commit file gone):
    a reader of its changes starts over from a snapshot."""
    checksum = _checksum(spark, path, new)
    if not 0 < new - old or not _plain(checksum.get("metadata")):
        return None
    files, just_appended = [], True
    for version in range(old + 1, new + 1):
        actions = _log_json(spark, path, f"{version:020d}.json")
        found = None if actions is None else changelog_version_files(actions)
        if found is None:
            return None
        files += [data_file(path, f) for f in found[0]]
        just_appended = just_appended and not found[1]
    return files, checksum["metadata"]["schemaString"], just_appended


def changelog_version_files(actions: list[dict[str, Any]]) -> tuple[list[str], bool] | None:
    """The data files one commit of a changelog table added (paths as its log states them,
    decoded), and whether it compacted (removed rows: its metadata's ``layout`` says so), if it
    appended, compacted or changed no data; else None.

    >>> info = {"commitInfo": {"userMetadata": '{"barrier": 4, "layout": "compacted"}'}}
    >>> add, remove = {"add": {"path": "b%201.parquet", "dataChange": True}}, {"remove": {"path": "a", "dataChange": True}}
    >>> changelog_version_files([info, add, remove]), changelog_version_files([{"commitInfo": {}}, add, remove])
    ((['b 1.parquet'], True), None)
    >>> optimized = [{"add": {"path": "c", "dataChange": False}}, {"remove": {"path": "a", "dataChange": False}}]
    >>> changelog_version_files(optimized), changelog_version_files([add]), changelog_version_files([add, {"metaData": {}}])
    (([], False), (['b 1.parquet'], False), None)
    """
    added, removed, layout = [], False, None
    for action in actions:
        ((kind, value),) = action.items()
        if kind == "commitInfo":
            layout = parse_metadata(value.get("userMetadata")).get("layout")
        elif kind in ("add", "remove"):
            if not value.get("dataChange", True):
                continue  # (OPTIMIZE: the same rows in other files)
            if value.get("deletionVector"):
                return None
            if kind == "add":
                added.append(unquote(value["path"]))
            removed = removed or kind == "remove"
        elif kind != "txn":
            return None
    return (added, removed) if not removed or layout == COMPACTED else None
