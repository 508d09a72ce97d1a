"""The changes of a table in the changelog layout, as change rows for the tables that read it.

A changelog table's barrier appends the new rows of the keys it changed
(``writes.append_groups``); each key's older rows stay behind them until a compaction. A table
that reads it needs each change as a retraction of the key's row before (-1) and its new row
(+1). The row before is a random old key's in a table of files, which only a read of most of
it would find: the cost the layout exists to avoid. So each table that reads one keeps the
last two rows of every key in Spark's state store (``state_stream.StateStream``): a streaming
aggregation by key, ``max_by(row, barrier, 2)``, fed the rows each barrier appended. For the
keys a barrier changed it emits their new row and the one before, if there was one (Flink
calls this normalizing an upsert changelog). Every plan then reads them as it reads any
source's change rows.

The state starts from the table's snapshot (each key's newest row) where the reading table is
recomputed anyway (its first barrier, a new generation or query) and where the changelog table
was rebuilt rather than appended to or compacted (``delta_log.changelog_appended_files``); the
reading table recomputes that barrier.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from coordinator.domain.snapshot import APPENDED, BARRIER, HIDDEN, ROW_KEY
from coordinator.domain.work import BarrierWork
from coordinator.faults import crash_point
from spark_jobs.planning.plan import WEIGHT
from spark_jobs.runtime.delta_log import changelog_appended_files, read_files
from spark_jobs.runtime.maintenance.state_stream import STATE_FOLDER, StateStream
from spark_jobs.runtime.maintenance.table import MaintainedTable, visible

LAST = f"{HIDDEN}last"  # a key's newest two rows, newest first


class ChangelogChanges:
    """The change rows of changelog table ``source`` for the table ``t`` reading it."""

    def __init__(self, t: MaintainedTable, source: str) -> None:
        self.t, self.source = t, source
        self.stream = StateStream(t.spark, f"{t.sink.path.rstrip('/')}/{STATE_FOLDER}/{source}",
                                  f"{t.job_id}_{source}_changes", "update", keep_first=False)
        self.schema: StructType | None = None  # the staged rows': the source's columns and its key

    def advance(self, work: BarrierWork, old: int | None, new: int) -> DataFrame | None:
        """The source's change rows from version ``old`` to ``new`` (its columns and ``WEIGHT``),
        the state moved on to ``new``; None where the state started over from ``new``'s
        snapshot instead (``old`` None: the reading table is recomputed at ``work``)."""
        location, found = self.t.locate(self.source), None
        if old is not None and self.stream.current(work.generation) is not None:
            found = changelog_appended_files(self.t.spark, location, old, new)
        if found is None:
            self.stream.start_new(work.generation, work.barrier)
            self.schema = None  # (the table's own, which a rebuild may have changed)
            self._run(work, self.t.snapshot(self.source, new))
            return None
        assert old is not None
        files, schema, just_appended = found
        rows = read_files(self.t.spark, files, schema).where(F.col(APPENDED))
        if new - old > 1:  # (several barriers' appends: a key's newest row replaces the row before them all)
            newest = Window.partitionBy(ROW_KEY).orderBy(F.col(BARRIER).desc())
            rows = rows.withColumn(LAST, F.row_number().over(newest)).where(F.col(LAST) == 1).drop(LAST)
        self._run(work, rows, files if just_appended and new - old == 1 else None)  # (an append's files: just its rows)
        crash_point("after_state_commit", self.t.crash_at)  # drills: the state has the barrier, the table not yet
        return self.stream.output(work.barrier).drop(BARRIER)

    def finish(self) -> None:
        """The reading table committed the barrier: what it staged and made goes."""
        self.stream.finish()

    def close(self) -> None:
        self.stream.close()

    def _run(self, work: BarrierWork, rows: DataFrame, files: list[str] | None = None) -> None:
        """Stage ``rows`` (a key's newest each, the barrier's or a snapshot's; ``files``: the data
        files that hold just them, copied) and fold them into the state."""
        staged = rows.select(*visible(rows).columns, ROW_KEY)
        if self.schema is None:
            self.schema = staged.schema
        with self.t.watch.phase("stage"):
            self.stream.stage({self.source: staged if files is None else files}, work.barrier)
        self.stream.run(lambda: {self.source: self.schema}, self._query, self.t.watch)

    def _query(self, session: SparkSession) -> str:
        """Each key's newest two rows by barrier; for the keys of a batch, the newest (+1) and
        the one before it (-1)."""
        assert self.schema is not None
        columns = [f.name for f in self.schema.fields if f.name not in (ROW_KEY, BARRIER)]
        row = ", ".join(f"'{c}', `{c}`" for c in columns)
        select = ", ".join(f"{LAST}.`{c}` AS `{c}`" for c in columns)
        return (f"SELECT {select}, IF({HIDDEN}i = 0, 1, -1) AS {WEIGHT}, {BARRIER} FROM (SELECT "
                f"max_by(named_struct({row}), {BARRIER}, 2) AS {HIDDEN}two, MAX({BARRIER}) AS {BARRIER} "
                f"FROM {self.source} GROUP BY {ROW_KEY}) LATERAL VIEW posexplode({HIDDEN}two) AS {HIDDEN}i, {LAST}")
