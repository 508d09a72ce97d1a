"""Lineage as three tables a reader can join (docs/reads.md: lineage tables), from the folded
state: ``__meta_etl_source(job_id, table_name, status)``, ``__meta_etl_sink(job_id,
table_name, status)`` (every job, running or ended; STALLED for a running one silent past the
liveness window) and ``__meta_table_version(table_name, barrier, version, generation,
committed_at)`` (exact points that still count). Spark's and the light reader's lineage views
are both made from these rows.

>>> from coordinator.domain import JobState, fold_all
>>> state = fold_all([JobState("j", "sums", ("events",))])
>>> lineage_rows(state, now_ms=0)["__meta_etl_source"].rows
[('j', 'events', 'RUNNING')]
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.state import MetaState

LINEAGE_TABLES = ("__meta_etl_source", "__meta_etl_sink", "__meta_table_version")
JOB_COLUMNS = (("job_id", "STRING"), ("table_name", "STRING"), ("status", "STRING"))
VERSION_COLUMNS = (("table_name", "STRING"), ("barrier", "BIGINT"), ("version", "BIGINT"), ("generation", "BIGINT"),
                   ("committed_at", "TIMESTAMP"))  # committed_at: epoch milliseconds in the rows


@dataclass(frozen=True)
class LineageTable:
    columns: tuple[tuple[str, str], ...]  # (name, SQL type)
    rows: list[tuple[object, ...]]


def lineage_rows(state: MetaState, now_ms: int, liveness_ms: int | None = None) -> dict[str, LineageTable]:
    """The three lineage tables of ``state`` (see the module); ``liveness_ms`` None: each job's
    status as recorded, without STALLED."""
    jobs = sorted(state.jobs.values(), key=lambda j: j.job_id)
    status = {j.job_id: str(j.status) if liveness_ms is None else state.status_of(j, now_ms, liveness_ms) for j in jobs}
    sources: list[tuple[object, ...]] = [(j.job_id, s, status[j.job_id]) for j in jobs for s in j.sources]
    sources += [(j.job_id, f"kafka:{t}", status[j.job_id]) for j in jobs for t in j.external_topics]
    versions: list[tuple[object, ...]] = [
        (c.table, c.barrier, c.delta_version, c.generation, c.committed_at_ms)
        for _, by_barrier in sorted(state.completions.items())
        for _, c in sorted(by_barrier.items())
        if state.counts(c)
    ]
    return {
        "__meta_etl_source": LineageTable(JOB_COLUMNS, sources),
        "__meta_etl_sink": LineageTable(JOB_COLUMNS, [(j.job_id, j.sink, status[j.job_id]) for j in jobs]),
        "__meta_table_version": LineageTable(VERSION_COLUMNS, versions),
    }
