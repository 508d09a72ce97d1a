"""The files Lockstep keeps for a table: its Delta directory, its dead letters, and the
checkpoints of the jobs that wrote it. ``lockstep drop`` removes them once the coordinator has
dropped the table, so a table of the same name starts afresh (a job's old checkpoint would
otherwise resume it after barriers whose data is gone)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from coordinator.domain.events import dead_letters
from coordinator.settings import Settings


def table_dirs(settings: Settings, table: str, jobs: Iterable[str] = ()) -> list[Path]:
    """Where ``table`` and what belongs to it live (whether or not they exist)."""
    warehouse = settings.warehouse.absolute()
    checkpoints = (settings.home / "checkpoints").absolute()
    return [warehouse / table, warehouse / dead_letters(table), *(checkpoints / job for job in sorted(set(jobs)))]


def remove_table_files(settings: Settings, table: str, jobs: Iterable[str] = ()) -> list[Path]:
    """Delete ``table``'s directories (see ``table_dirs``); returns those that existed."""
    removed = [path for path in table_dirs(settings, table, jobs) if path.exists()]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
