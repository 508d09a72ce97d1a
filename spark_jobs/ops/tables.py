"""The files Lockstep keeps for a table: its Delta directory, its dead letters, and the
checkpoints of the jobs that wrote it (and, with a metastore, the names of the table and its
dead letters). ``lockstep drop`` removes them once the coordinator has
dropped the table, so a table of the same name starts afresh (a job's old checkpoint would
otherwise resume it after barriers whose data is gone). They are removed through Hadoop's file
system API, so an object-store warehouse is cleaned like a local one."""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.domain.events import dead_letters
from coordinator.settings import Settings
from spark_jobs.runtime.catalog import forget_table
from spark_jobs.runtime.storage import Storage


def table_locations(settings: Settings, table: str, jobs: Iterable[str] = ()) -> list[str]:
    """Where ``table`` and what belongs to it live (whether or not they exist)."""
    return [settings.table_location(table), settings.table_location(dead_letters(table)),
            *(str(settings.checkpoints / job) for job in sorted(set(jobs)))]


def remove_table(storage: Storage, settings: Settings, table: str, jobs: Iterable[str] = ()) -> list[str]:
    """Forget ``table``'s names in the metastore and delete its folders (see ``table_locations``);
    returns the folders that existed."""
    for name in (table, dead_letters(table)):
        forget_table(storage.spark, name)
    removed = [location for location in table_locations(settings, table, jobs) if storage.exists(location)]
    for location in removed:
        storage.delete(location)
    return removed
