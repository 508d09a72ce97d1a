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
from coordinator.domain.lineage import LINEAGE_TABLES, lineage_rows
from coordinator.settings import Settings

META_TABLES = LINEAGE_TABLES


def is_meta_table(name: str) -> bool:
    return name.lower() in META_TABLES


def lineage_frames(spark: SparkSession, state: MetaState, liveness_ms: int | None = None) -> dict[str, DataFrame]:
    """The three lineage tables of ``state`` as DataFrames (``coordinator.domain.lineage``)."""
    frames = {}
    for name, table in lineage_rows(state, now_ms(), liveness_ms).items():
        at = [i for i, (_, kind) in enumerate(table.columns) if kind == "TIMESTAMP"]
        rows = [tuple(datetime.fromtimestamp(v / 1000, UTC) if i in at else v for i, v in enumerate(row))
                for row in table.rows]
        frames[name] = spark.createDataFrame(rows, ", ".join(f"{column} {kind}" for column, kind in table.columns))
    return frames


def register_lineage_views(spark: SparkSession, settings: Settings | None = None) -> list[str]:
    """Register the lineage tables as temp views of ``spark``; returns their names."""
    settings = settings or Settings.from_env()
    for name, frame in lineage_frames(spark, read_state(settings), settings.barriers.liveness_ms).items():
        frame.createOrReplaceTempView(name)
    return list(META_TABLES)
