"""``lockstep vacuum``: delete old Delta files that no lease, running job or retention needs.

The coordinator's state says which versions of a table must stay readable and why
(``coordinator.domain.retention``); the oldest of them is the table's floor. The files to
delete are those no version from the floor on references, written before the floor was
committed (so a write in flight is never touched). A root table's dead letters (``<t>__dlq``)
go with it: they keep every version from the one that held them at the table's oldest kept
exact point (a revision puts them back there). Delta's own VACUUM deletes them, given
exactly that list as its inventory: its time-based retention counts in whole hours
(``RETAIN 0.5 HOURS`` is rounded), too coarse to keep one version and not the one before.
Streaming checkpoints go too once they are not the table's own: those of a table of the same
name dropped before (another table id), and those an older Lockstep kept by job name for the
table's jobs (``stale``).
Files are listed and read through Hadoop's file system API, so an object-store warehouse
(``s3a://``) is vacuumed like a local one.

Example::

    for report in vacuum(spark, settings, ["user_item_amount"], retain_barriers=0, dry_run=True):
        print(report.table, report.floor, len(report.files), [k.reason for k in report.keeps])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from coordinator.client.state import read_state
from coordinator.domain import MetaState
from coordinator.domain.errors import check_known
from coordinator.domain.events import dead_letters
from coordinator.domain.retention import Keep, versions_to_keep
from coordinator.settings import Settings
from spark_jobs.ops.tables import checkpoint_folders
from spark_jobs.runtime.delta_log import data_file, log_file, parse_metadata
from spark_jobs.runtime.maintenance.state_stream import STATE_FOLDER
from spark_jobs.runtime.session import session_conf
from spark_jobs.runtime.storage import Storage

SAFETY_MS = 1000  # only files written this long before the floor's commit may go (clock and write skew)
VACUUM_CONF = {
    "spark.databricks.delta.retentionDurationCheck.enabled": "false",  # RETAIN 0 HOURS over our own inventory
    # Delta lists with this many tasks (default 10,000: 100 s for a small table on two cores, 7 s with 4)
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
}
INVENTORY = "path STRING, length BIGINT, isDir BOOLEAN, modificationTime BIGINT"


@dataclass(frozen=True)
class VacuumReport:
    """One table: the oldest version kept readable (None: no Delta table yet), why each kept
    version is kept, and the files deleted (with ``dry_run``: that would be deleted); ``stale``,
    the folders of streaming state that was not the table's own, deleted the same way."""

    table: str
    floor: int | None
    keeps: list[Keep]
    files: list[str]
    dry_run: bool
    stale: list[str] = field(default_factory=list)


def vacuum(spark: SparkSession, settings: Settings, tables: Sequence[str] = (), retain_barriers: int | None = None,
           dry_run: bool = False, state: MetaState | None = None) -> list[VacuumReport]:
    """Vacuum ``tables`` (default: every registered table); ``retain_barriers`` defaults to
    ``settings.retain_barriers`` (LOCKSTEP_RETAIN_BARRIERS)."""
    state = state if state is not None else read_state(settings)
    names = list(tables) or sorted(state.tables)
    check_known(names, state.tables)
    retain = settings.retain_barriers if retain_barriers is None else retain_barriers
    reports = []
    for name in names:
        path = settings.table_location(name)
        report = _vacuum_table(spark, path, name, versions_to_keep(state, name, retain), dry_run)
        report.stale.extend(_stale_state(Storage(spark), settings, state, name, dry_run))
        reports.append(report)
        dead = settings.table_location(dead_letters(name))
        if report.floor is not None and DeltaTable.isDeltaTable(spark, dead):
            keeps = _dead_letters_to_keep(spark, dead, name, state, report.floor)
            reports.append(_vacuum_table(spark, dead, dead_letters(name), keeps, dry_run))
    return reports


def _stale_state(storage: Storage, settings: Settings, state: MetaState, table: str, dry_run: bool) -> list[str]:
    """Delete (with ``dry_run``: list) the checkpoints on this machine of tables named ``table``
    that are not this one (another table id: one dropped before), and those an older Lockstep
    kept by job name (``$LOCKSTEP_HOME/checkpoints/<job>``) for the table's jobs."""
    jobs = sorted(j for j, job in state.jobs.items() if job.sink == table)
    stale = [p.as_uri() for p in checkpoint_folders(settings, table, keep=state.tables[table].table_id)]
    stale += [(settings.checkpoints / job).as_uri() for job in jobs if (settings.checkpoints / job).is_dir()]
    if not dry_run:
        for location in stale:
            storage.delete(location)
    return stale


def _dead_letters_to_keep(spark: SparkSession, path: str, table: str, state: MetaState, floor: int) -> list[Keep]:
    """The dead letters' versions as of ``table``'s oldest kept exact point (at version ``floor``
    or later): per generation, its newest commit at or before that barrier, else its oldest."""
    everything = [Keep(0, f"{table} has no exact point to align its dead letters with")]
    kept = [b for b, v in state.exact_points(table).items() if v >= floor]
    if not kept:
        return everything
    barrier = min(kept)
    by_generation: dict[int, list[tuple[int, int]]] = {}
    for row in DeltaTable.forPath(spark, path).history().select("version", "userMetadata").collect():
        meta = parse_metadata(row["userMetadata"])
        if "barrier" in meta:
            by_generation.setdefault(int(meta.get("generation", 0)), []).append((int(meta["barrier"]), int(row["version"])))
    versions = [max((v for b, v in commits if b <= barrier), default=min(v for _, v in commits))
                for commits in by_generation.values()]
    reason = f"dead letters as of barrier {barrier}, the oldest kept exact point of {table}"
    return [Keep(min(versions), reason)] if versions else everything


def _vacuum_table(spark: SparkSession, path: str, name: str, keeps: list[Keep], dry_run: bool) -> VacuumReport:
    if not DeltaTable.isDeltaTable(spark, path):
        return VacuumReport(name, None, keeps, [], dry_run)
    commits = {int(r["version"]): int(r["at"]) for r in DeltaTable.forPath(spark, path).history()
               .select("version", (F.col("timestamp").cast("double") * 1000).cast("long").alias("at")).collect()}
    floor = max(min((k.version for k in keeps), default=max(commits)), min(commits))
    storage = Storage(spark)
    inventory = _unneeded_files(spark, storage, path, floor, commits[floor] - SAFETY_MS, max(commits))
    if not inventory:
        return VacuumReport(name, floor, keeps, [], dry_run)
    spark.createDataFrame(inventory, INVENTORY).createOrReplaceTempView("__lockstep_vacuum_inventory")
    with session_conf(spark, VACUUM_CONF):
        sql = f"VACUUM delta.`{path}` USING INVENTORY (SELECT * FROM __lockstep_vacuum_inventory) RETAIN 0 HOURS"
        files = [r[0] for r in spark.sql(sql + " DRY RUN").collect()]
        if not dry_run and files:
            spark.sql(sql).collect()
            files = [f for f in files if not storage.exists(f)]
    return VacuumReport(name, floor, keeps, sorted(files), dry_run)


def _key(uri: str) -> str:
    """A data file's path for comparing URIs of one table (``file:/t/a``, ``file:///t/a`` and
    ``/t/a`` are one file; percent-escapes undone).

    >>> _key("file:///w/t/a%20b.parquet"), _key("s3a://lake/w/t/a.parquet"), _key("/w/t/a.parquet")
    ('/w/t/a b.parquet', '/w/t/a.parquet', '/w/t/a.parquet')
    """
    return unquote(urlparse(uri).path)


def _unneeded_files(spark: SparkSession, storage: Storage, path: str, floor: int, written_before_ms: int,
                    latest: int) -> list[tuple[str, int, bool, int]]:
    """Data and change files under ``path`` that no version >= ``floor`` uses, written before
    ``written_before_ms``, as Delta inventory rows."""
    needed = {_key(f) for f in spark.read.format("delta").option("versionAsOf", floor).load(path).inputFiles()}
    for version in range(floor + 1, latest + 1):
        actions = log_file(spark, path, f"{version:020d}.json")
        if actions is None:
            return []  # the log no longer has every commit: cannot tell what is needed, delete nothing
        for action in actions:
            for kind in ("add", "cdc"):
                if kind in action:
                    needed.add(_key(data_file(path, unquote(action[kind]["path"]))))
    return [(f.uri, f.size, False, f.modified_ms) for f in storage.files(path, ".parquet")
            if "/_delta_log/" not in f.uri and f"/{STATE_FOLDER}/" not in f.uri  # (a keyed join's staged rows)
            and _key(f.uri) not in needed and f.modified_ms < written_before_ms]
