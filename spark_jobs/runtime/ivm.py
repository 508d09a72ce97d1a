"""Maintaining intermediate tables at each barrier, incrementally where the plan allows.

For barrier ``b`` the job knows the source versions it reflected last (``base``) and the
sources' exact points at ``b``. It turns the sources' changes between the two into **change
rows with a weight** (+n inserted, -n retracted), by the plan's shape
(``maintenance.change_rows``): one source's changes through the query; a join's rows whose
join key changed; the delta rule for INNER joins of more tables; each UNION ALL branch; or
the rows of the groups the changes touch. A Python table follows its source's changed rows
if its function is row-wise (``maintenance.functions``).

Equal rows with opposite weights cancel. The rest is applied to the sink in one commit per
barrier (``maintenance.writes``): by key (projection, join), appended (append-only inputs), or
folded into the groups of an aggregate (``maintenance.aggregates``: SUM/COUNT/AVG by
arithmetic on kept bookkeeping columns; MIN/MAX and COUNT(DISTINCT) recompute just the groups
that need it). Queries outside these shapes are recomputed from the snapshots at ``b`` (full
refresh), and so is the first barrier a job processes, and any barrier whose changes cost more
to apply than recomputing did (``costs``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession

from coordinator.client.clock import now_ms
from coordinator.domain.work import BarrierWork
from coordinator.settings import CrashAt
from spark_jobs.planning.pipeline import DerivedTable
from spark_jobs.planning.plan import Plan, PlanKind
from spark_jobs.runtime.commits import CompletionPublisher, DeltaSink
from spark_jobs.runtime.costs import CostChoice
from spark_jobs.runtime.maintenance.change_rows import numbered
from spark_jobs.runtime.maintenance.changelog_changes import ChangelogChanges
from spark_jobs.runtime.maintenance.functions import DEAD_LETTERS_PHASE, check_row_wise, follow_row_wise, recompute_function
from spark_jobs.runtime.maintenance.keyed import KeyedState
from spark_jobs.runtime.maintenance.table import REWRITE_LIMIT_BYTES, MaintainedTable
from spark_jobs.runtime.maintenance.writes import Written, apply_changes, write_result
from spark_jobs.runtime.stopwatch import Stopwatch

log = logging.getLogger(__name__)


@dataclass
class TableMaintainer:
    """Runs one derived table's job: ``process(work)`` for every barrier, in order, each the
    cheapest way its plan allows."""

    spark: SparkSession
    table: DerivedTable
    plan: Plan
    job_id: str
    locate: Callable[[str], str]  # table name -> its location (Settings.table_location)
    publisher: CompletionPublisher
    # A table up to this size is rewritten whole at each barrier (one Spark job); a larger one
    # gets a MERGE of the changed rows (``maintenance.writes``).
    rewrite_limit_bytes: int = REWRITE_LIMIT_BYTES
    crash_at: CrashAt | None = None  # drills only (LOCKSTEP_CRASH_AT)
    compact_every: int = 0  # LOCKSTEP_COMPACT_EVERY (0: never)
    costs: CostChoice = field(default_factory=CostChoice)  # applying the changes or recomputing, by cost
    table_id: str = ""  # the coordinator's id of the table (TableState.table_id): its commits carry it

    def __post_init__(self) -> None:
        # The table is created by its first barrier's write (CREATE TABLE AS SELECT is atomic).
        sink = DeltaSink(self.spark, self.locate(self.table.name), self.job_id, None, create_on_first_write=True,
                         crash_at=self.crash_at, compact_every=self.compact_every, name=self.table.name,
                         table_id=self.table_id)
        self.maintained = MaintainedTable(
            self.spark, self.table, self.plan, self.job_id, self.locate, sink,
            hashlib.sha256((self.table.query + "\nkeyed" * self.table.keyed
                            + "\nchangelog" * self.table.changelog).encode()).hexdigest()[:16], self.costs,
            self.crash_at, self.compact_every,
            schema=self.spark.read.format("delta").load(sink.path).schema if sink.exists else None)
        self.keyed = KeyedState(self.maintained) if self.plan.keyed else None
        self.changelogs = {s: ChangelogChanges(self.maintained, s) for s in self.plan.changelog_sources}
        # generation, the source versions reflected, and the sink version
        self.base: tuple[int, dict[str, int], int] | None = None
        self._row_wise_checked = False  # a ROW_WISE plan's function was found row-wise (or the plan changed)
        self.recomputed = False  # whether the last barrier recomputed the table rather than applied its changes

    @property
    def sink(self) -> DeltaSink:
        """The table's Delta sink: its path and the versions its barriers committed."""
        return self.maintained.sink

    @property
    def watch(self) -> Stopwatch:
        """Where the time of the barrier in progress, or the last one, went."""
        return self.maintained.watch

    def close(self) -> None:
        """The job's query stopped: finish its table's upkeep (``DeltaSink.close``), let go of its producer."""
        self.stop_streams()
        self.maintained.sink.close()
        if self.maintained.dlq is not None:
            self.maintained.dlq.close()
        self.publisher.close()

    def stop_streams(self) -> None:
        """Stop the table's streaming queries (a keyed table's, a changelog source's changes'):
        their states stay, and the next barrier starts them again on their checkpoints."""
        if self.keyed is not None:
            self.keyed.close()
        for changes in self.changelogs.values():
            changes.close()

    def process(self, work: BarrierWork) -> None:
        started = now_ms()
        t = self.maintained
        t.watch = Stopwatch()
        t.rewrite_limit_bytes = self.rewrite_limit_bytes
        sources = dict(work.source_versions)
        done = t.sink.versions.get((work.generation, work.barrier))
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
                               counts, source_versions=sources, phases=t.watch.phases())

    def _maintain(self, work: BarrierWork, base: tuple[dict[str, int], int] | None) -> Written:
        """Apply the changes, or recompute: the first barrier, a plan that is not incremental, or a
        table whose changes cost more to apply than recomputing it did (``costs``)."""
        t = self.maintained
        if self.keyed is not None:  # rebuilt, not recomputed, where it cannot go on (its own choice)
            return self.keyed.process(work, base)
        if t.plan.kind == PlanKind.ROW_WISE and not self._row_wise_checked:
            check_row_wise(t, work)
            self.plan, self._row_wise_checked = t.plan, True  # (the plan explain and tests read)
        whole = base is None or not t.plan.incremental
        if not self._changelog_changes(work, base) and not whole:
            whole = True
            log.info("table %s: a changelog table it reads was rebuilt; recomputing it", self.table.name)
        if not whole and self.costs.whole():
            whole = True
            log.info("table %s: recomputing it (%.1f s last time) is cheaper than applying its changes (%.1f s)",
                     self.table.name, self.costs.whole_s, self.costs.applied_s)
        began, self.recomputed = time.monotonic(), whole
        if t.plan.kind == PlanKind.ROW_WISE:
            version, counts = follow_row_wise(t, work, None if whole else base)
        elif whole:
            version, counts = self._recompute(work)
        else:
            assert base is not None
            version, counts = apply_changes(t, work, base)
        # a barrier that searched for the rows a function raised on (a failed attempt, then one
        # per part) measures neither way: it would make applying the changes look dear
        if t.plan.incremental and not t.watch.entered(DEAD_LETTERS_PHASE):
            self.costs.measured(whole, time.monotonic() - began)
        for changes in self.changelogs.values():
            changes.finish()
        return version, counts

    def _changelog_changes(self, work: BarrierWork, base: tuple[dict[str, int], int] | None) -> bool:
        """Move each changed changelog source's state on to the barrier, its change rows kept
        for the plan (``MaintainedTable.prepared``); False where one started over (a first
        barrier, a rebuilt changelog table): the table is recomputed then. Every barrier moves
        them on, a recomputed one too, so each state stays at the version the table reflects."""
        t, ready = self.maintained, True
        t.prepared = {}
        for source, changes in self.changelogs.items():
            old, new = None if base is None else base[0].get(source), work.source_versions[source]
            rows = changes.advance(work, old, new) if old != new else None
            if rows is not None:
                t.prepared[source] = rows
            ready = ready and (old == new or rows is not None)
        return ready

    def _base(self, work: BarrierWork) -> tuple[dict[str, int], int] | None:
        """What the table reflects before ``work``: None (recompute) in a new generation (a
        revision) or when the job's query changed since the table's last commit."""
        if self.base is not None and self.base[0] == work.generation:
            return self.base[1], self.base[2]
        sink = self.maintained.sink
        last = sink.last_commit(work.generation, work.barrier)
        if last is None or sink.queries.get((work.generation, last[0]), self.maintained.query_id) != self.maintained.query_id:
            return None
        sources = sink.sources.get((work.generation, last[0]))
        self.costs.restore(sink.costs.get((work.generation, last[0]), {}))  # (a restart: measured before)
        return None if sources is None else (sources, last[1])

    def _recompute(self, work: BarrierWork) -> Written:
        """Compute the whole table from the sources' snapshots at the barrier and overwrite it
        (one Spark job; its rows are counted on the way)."""
        t = self.maintained
        if self.table.python is not None:
            return recompute_function(t, work)

        def result() -> DataFrame:
            t.views(work.source_versions)
            return numbered(t, t.spark.sql(t.plan.full_query or t.plan.query))

        return write_result(t, work, result, "overwrite")
