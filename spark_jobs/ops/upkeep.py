"""Vacuum on a schedule, in the process that runs the jobs: a table's old files go without
anyone running ``lockstep vacuum``, so a pipeline that runs for weeks keeps its disk bounded.

It is the same lease-aware vacuum (``spark_jobs.ops.vacuum``) with the same retention: files
that a lease, a running job, read-committed readers or the newest ``LOCKSTEP_RETAIN_BARRIERS``
barriers need stay. Vacuum only deletes files written before the oldest kept version's commit,
so it never races a job's write in progress. A failed round is reported and retried next time.

Example::

    with TableUpkeep(spark, settings, ["shopping", "user_item_amount"], report=print):
        ...  # run the jobs; every LOCKSTEP_VACUUM_EVERY_S seconds their old files go
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from types import TracebackType

from pyspark.sql import SparkSession

from coordinator.settings import Settings
from spark_jobs.ops.vacuum import vacuum
from spark_jobs.runtime.session import spark_error


class TableUpkeep:
    """A daemon thread that vacuums ``tables`` every ``every_s`` seconds (0: never)."""

    def __init__(self, spark: SparkSession, settings: Settings, tables: Sequence[str],
                 report: Callable[[str], None] = lambda message: None, every_s: float | None = None) -> None:
        self.spark, self.settings, self.tables, self.report = spark, settings, sorted(set(tables)), report
        self.every_s = settings.vacuum_every_s if every_s is None else every_s
        self.rounds = 0
        self.deleted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lockstep-upkeep", daemon=True)

    def start(self) -> TableUpkeep:
        if self.every_s > 0 and self.tables:
            self._thread.start()
        return self

    def __enter__(self) -> TableUpkeep:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)

    def _loop(self) -> None:
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", "upkeep")  # not in the jobs' pools
        while not self._stop.wait(self.every_s):
            try:
                reports = vacuum(self.spark, self.settings, self.tables)
            except Exception as exc:  # noqa: BLE001 - the jobs run on; the next round tries again
                self.report(f"scheduled vacuum failed (next try in {self.every_s:.0f} s): {spark_error(exc)}")
                continue
            self.rounds += 1
            deleted = {r.table: len(r.files) for r in reports if r.files}
            self.deleted += sum(deleted.values())
            if deleted:
                self.report("scheduled vacuum deleted " + ", ".join(f"{n} file(s) of {t}" for t, n in deleted.items()))
