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

from pyspark.sql import DataFrame, SparkSession

from coordinator.client.clock import now_ms
from coordinator.client.state import lineage_tables
from coordinator.domain import MetaState
from coordinator.domain.lineage import LINEAGE_TABLES, lineage_rows
from coordinator.settings import Settings
from lockstep_reads import spark as spark_reads


def lineage_frames(spark: SparkSession, state: MetaState, liveness_ms: int | None = None) -> dict[str, DataFrame]:
    """The three lineage tables of ``state`` as DataFrames (``coordinator.domain.lineage``)."""
    return spark_reads.lineage_frames(spark, lineage_rows(state, now_ms(), liveness_ms))


def register_lineage_views(spark: SparkSession, settings: Settings | None = None) -> list[str]:
    """Register the lineage tables as temp views of ``spark``; returns their names."""
    for name, frame in spark_reads.lineage_frames(spark, lineage_tables(settings or Settings.from_env())).items():
        frame.createOrReplaceTempView(name)
    return list(LINEAGE_TABLES)
