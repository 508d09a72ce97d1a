"""Lineage as tables a Spark user can join (docs/reads.md: lineage tables).

``__meta_etl_source(job_id, table_name, status)``, ``__meta_etl_sink(job_id, table_name, status)``
(status: RUNNING, STALLED, FINISHED, CANCELED or FAILED) and
``__meta_table_version(table_name, barrier, version, generation, committed_at)``, built from
the same fold of the state topics every other component uses. FLIP-276's example, "the sink
tables of the jobs that read Table1", runs as written::

    register_lineage_views(spark)
    spark.sql("SELECT T.table_name FROM __META_ETL_SINK AS T JOIN __META_ETL_SOURCE AS S "
              "ON T.job_id = S.job_id WHERE S.table_name = 'shopping'").show()
"""

from __future__ import annotations

from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession

from coordinator.client.clock import now_ms
from coordinator.client.state import read_state
from coordinator.domain import MetaState
from coordinator.settings import Settings

META_TABLES = ("__meta_etl_source", "__meta_etl_sink", "__meta_table_version")


def is_meta_table(name: str) -> bool:
    return name.lower() in META_TABLES


def lineage_frames(spark: SparkSession, state: MetaState, liveness_ms: int | None = None) -> dict[str, DataFrame]:
    """The three lineage tables of ``state`` (every job with its status, so a stopped job's
    lineage stays visible, and STALLED for a running one silent past ``liveness_ms``; exact
    points that still count)."""
    jobs = sorted(state.jobs.values(), key=lambda j: j.job_id)
    now = now_ms()
    status = {j.job_id: str(j.status) if liveness_ms is None else state.status_of(j, now, liveness_ms) for j in jobs}
    sources = [(j.job_id, s, status[j.job_id]) for j in jobs for s in j.sources]
    sources += [(j.job_id, f"kafka:{t}", status[j.job_id]) for j in jobs for t in j.external_topics]
    versions = [
        (c.table, c.barrier, c.delta_version, c.generation, datetime.fromtimestamp(c.committed_at_ms / 1000, UTC))
        for table, by_barrier in sorted(state.completions.items())
        for _, c in sorted(by_barrier.items())
        if state.counts(c)
    ]
    return {
        "__meta_etl_source": spark.createDataFrame(sources, "job_id STRING, table_name STRING, status STRING"),
        "__meta_etl_sink": spark.createDataFrame([(j.job_id, j.sink, status[j.job_id]) for j in jobs],
                                                 "job_id STRING, table_name STRING, status STRING"),
        "__meta_table_version": spark.createDataFrame(
            versions, "table_name STRING, barrier BIGINT, version BIGINT, generation BIGINT, committed_at TIMESTAMP"),
    }


def register_lineage_views(spark: SparkSession, settings: Settings | None = None) -> list[str]:
    """Register the lineage tables as temp views of ``spark``; returns their names."""
    settings = settings or Settings.from_env()
    for name, frame in lineage_frames(spark, read_state(settings), settings.barriers.liveness_ms).items():
        frame.createOrReplaceTempView(name)
    return list(META_TABLES)
