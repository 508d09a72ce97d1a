"""The files Lockstep keeps for a table: its Delta directory (with its keyed states in it), its
dead letters, its jobs' streaming checkpoints (and, with a metastore, the names of the table and
its dead letters). ``lockstep drop`` removes them once the coordinator has dropped the table, so
a table of the same name starts afresh. They are removed through Hadoop's file system API, so
an object-store warehouse is cleaned like a local one."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from coordinator.domain.events import TableState, dead_letters
from coordinator.settings import Settings
from spark_jobs.runtime.catalog import forget_table
from spark_jobs.runtime.storage import Storage


def checkpoint_location(settings: Settings, job_id: str, table: TableState) -> str:
    """Where job ``job_id``'s streaming checkpoint lives: on the disk of the machine that runs the
    job's Spark driver (Spark's checkpoint needs a file system that lists empty folders, which an
    S3 API does not promise), in a folder named for the coordinator's topic prefix, the table and
    its id, so a job never resumes the checkpoint of another table of the same name (another
    pipeline's, or one dropped before). The offsets it records name the table id and the
    generation too (``spark_jobs.runtime.epochs``); a job without its checkpoint (a new machine)
    starts from its table's newest exact point.

    >>> s = Settings(home=Path("/lake/home"), topic_prefix="shop")
    >>> checkpoint_location(s, "ingest_t", TableState("t", "root", table_id="7f3a"))
    'file:///lake/home/checkpoints/shop/t-7f3a/ingest_t'
    """
    return (settings.checkpoints / settings.topic_prefix / _folder(table.name, table.table_id) / job_id).as_uri()


def _folder(table: str, table_id: str) -> str:
    return f"{table}-{table_id}" if table_id else table


def checkpoint_folders(settings: Settings, table: str, keep: str | None = None) -> list[Path]:
    """The folders of checkpoints of tables named ``table`` on this machine for this coordinator,
    but the one of the table with id ``keep`` (those of its jobs, ``checkpoint_location``)."""
    home = settings.checkpoints / settings.topic_prefix
    names = [p for p in home.glob(f"{table}-*") if p.name.rsplit("-", 1)[0] == table] + [home / table]
    return sorted(p for p in names if p.is_dir() and (keep is None or p.name != _folder(table, keep)))


def table_locations(settings: Settings, table: str, jobs: Iterable[str] = ()) -> list[str]:
    """Where ``table`` and what belongs to it live: its folder, its dead letters' (whether or not they
    exist), its jobs' checkpoints, and those an older Lockstep kept by job name (``jobs``, the jobs
    that wrote it: $LOCKSTEP_HOME/checkpoints/<job>)."""
    return [settings.table_location(table), settings.table_location(dead_letters(table)),
            *(p.as_uri() for p in checkpoint_folders(settings, table)),
            *((settings.checkpoints / job).as_uri() for job in sorted(set(jobs)))]


def remove_table(storage: Storage, settings: Settings, table: str, jobs: Iterable[str] = ()) -> list[str]:
    """Forget ``table``'s names in the metastore and delete its folders (see ``table_locations``);
    returns the folders that existed."""
    for name in (table, dead_letters(table)):
        forget_table(storage.spark, name)
    removed = [location for location in table_locations(settings, table, jobs) if storage.exists(location)]
    for location in removed:
        storage.delete(location)
    return removed
