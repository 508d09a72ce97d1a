"""Tables declared ``WITH ('state' = 'keyed')`` (``spark_jobs.planning.keyed``): a keyed join,
whose two sides' rows are kept by join key in Spark's state store, or a keyed aggregate, whose
groups' running aggregates are (a Top-N is one: each partition's first rows, a running
max_by). A barrier's new rows then find their matches, or their groups, by a key lookup
instead of by reading the tables, so a barrier costs what its changes cost, not what the
tables hold.

One streaming query per table runs for the job's life (``state_stream.StateStream``): Spark's
stream-stream join (its joined rows appended) or streaming aggregation (in update mode: the
groups a batch changed) over each source's staged rows, with the RocksDB state store, one
micro-batch a barrier. Its checkpoint is kept in the table's folder (``_lockstep_state``). At
each barrier the job stages each source's new rows, lets the query process them, and commits
the rows it made to the table (txn-marked): the joined rows appended, the changed groups
MERGEd by the GROUP BY columns (or appended with their key and barrier, in the changelog
layout: ``writes.append_groups``).

The state is rebuilt (a new folder; the sources' snapshots staged as the barrier's rows; the
table overwritten with the result) in these cases:
* at a generation's first barrier;
* for a table with no state;
* when a barrier updates or deletes a source row, which a join or a running aggregate of
  inserts cannot take back.
"""

from __future__ import annotations

import logging
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from coordinator.domain.snapshot import APPENDED, BARRIER, ROW_KEY
from coordinator.domain.work import BarrierWork
from coordinator.faults import crash_point
from spark_jobs.planning.keyed import top_n_query
from spark_jobs.planning.plan import PlanKind, output_key
from spark_jobs.runtime.delta_log import table_bytes
from spark_jobs.runtime.maintenance.state_stream import STATE_FOLDER, StateStream
from spark_jobs.runtime.maintenance.table import MaintainedTable
from spark_jobs.runtime.maintenance.writes import Written, append_groups, upsert_groups, write_result

log = logging.getLogger(__name__)


class KeyedState:
    """The state and streaming query of one keyed table (``TableMaintainer`` makes it)."""

    def __init__(self, t: MaintainedTable) -> None:
        self.t = t
        self.aggregate = t.plan.kind == PlanKind.KEYED_AGGREGATE  # (else a join)
        self.stream = StateStream(t.spark, f"{t.sink.path.rstrip('/')}/{STATE_FOLDER}", f"{t.job_id}_keyed",
                                  "update" if self.aggregate else "append")

    def process(self, work: BarrierWork, base: tuple[dict[str, int], int] | None) -> Written:
        """Maintain the table at ``work``: from the state, or by rebuilding it."""
        if base is not None and self.stream.current(work.generation) is not None:
            try:
                rows = self._inserted(base[0], work)
                if rows is not None:
                    return self._advance(work, rows, base[1])
            finally:
                self.t.release()
            log.info("table %s: barrier %d updates or deletes a source row; its keyed state is rebuilt",
                     self.t.table.name, work.barrier)
        return self._rebuild(work)

    def close(self) -> None:
        """Stop the streaming query (its state stays, checkpointed)."""
        self.stream.close()

    def _rebuild(self, work: BarrierWork) -> Written:
        """Start a new state from the sources' snapshots at the barrier, and overwrite the table."""
        self.stream.start_new(work.generation, work.barrier)
        return self._advance(work, self.t.snapshots(work), None)

    def _inserted(self, old: dict[str, int], work: BarrierWork) -> dict[str, DataFrame | list[str]] | None:
        """Each changed source's inserted rows since ``old`` (the data files that hold just them,
        where its versions only appended); None if a change retracts a row."""
        rows: dict[str, DataFrame | list[str]] = {}
        for source, version in work.source_versions.items():
            if old.get(source) == version:
                continue
            found = self.t.added(source, old[source], version) if source in old else None
            if found is None:  # (or a source the last commit did not record)
                return None
            rows[source] = found[0] if found[1] is None else found[1]
        return rows

    def _advance(self, work: BarrierWork, rows: dict[str, DataFrame | list[str]], old_sink: int | None) -> Written:
        """Stage ``rows``, let the query join or aggregate them with the state, commit its rows
        to the table at version ``old_sink`` (None: a rebuild, which overwrites it)."""
        self._run(work, rows)
        crash_point("after_state_commit", self.t.crash_at)  # drills: the state has the batch, the table not yet
        made = self.stream.output(work.barrier)
        changelog = self.t.plan.changelog

        def result() -> DataFrame:
            return with_row_key(self.t, made, appended=old_sink is not None) if changelog else made.drop(BARRIER)

        if old_sink is not None:
            writes = append_groups if changelog else upsert_groups
            written = writes(self.t, work, result(), old_sink) if self.aggregate \
                else write_result(self.t, work, result, "append")
        else:
            began = time.monotonic()
            written = write_result(self.t, work, result, "overwrite")
            if self.aggregate:  # what a rewrite costs (``upsert_groups`` chooses by it)
                self.t.costs.measured(True, time.monotonic() - began)
            if changelog:
                self.t.costs.laid_out(True, table_bytes(self.t.spark, self.t.sink.path))
        self.stream.finish()  # committed: the next barrier stages and joins rows of its own
        return written

    def _run(self, work: BarrierWork, rows: dict[str, DataFrame | list[str]]) -> None:
        """Stage ``rows`` and let the query join or aggregate them with the state: the barrier's
        state commit."""
        with self.t.watch.phase("stage"):
            self.stream.stage(rows, work.barrier)
        self.stream.run(lambda: {s: self.t.snapshot(s, v).schema for s, v in work.source_versions.items()},
                        self._query, self.t.watch)

    def _query(self, session: SparkSession) -> str:
        """The streaming query: the plan's, or a Top-N's, made with its ORDER BY's types."""
        top = self.t.plan.top_n
        if top is None:
            return self.t.plan.change_query
        order = [sql for sql, _, _ in top.order]
        probe = session.sql(f"SELECT {', '.join(order)} FROM {top.source}")
        return top_n_query(top, {sql: f.dataType.simpleString() for sql, f in zip(order, probe.schema.fields, strict=True)})


def with_row_key(t: MaintainedTable, rows: DataFrame, appended: bool) -> DataFrame:
    """A changelog table's ``rows`` (with their ``BARRIER``) with their ``ROW_KEY``, the GROUP BY
    values (a Top-N's partition and rank) as JSON (times in UTC whatever the session's zone, so a
    key is the same string at every barrier), and whether they are ``APPENDED`` (else the
    table's whole, one row a key)."""
    key = output_key(t.plan, [c for c in rows.columns if c != BARRIER])
    assert key is not None
    return rows.withColumn(ROW_KEY, F.to_json(F.struct(*map(F.col, key)), {"timeZone": "UTC"})) \
        .withColumn(APPENDED, F.lit(appended))
