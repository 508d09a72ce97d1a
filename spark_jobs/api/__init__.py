"""What Spark users call: the CTAS builder, lineage views, job hooks. Consistent reads have one
front door for every engine, ``lockstep_reads.open_snapshot(tables, ..., spark=spark)``; the
``open_snapshot(spark, ...)`` and ``ConsistentSnapshot`` here are deprecated aliases of it.

Example::

    from spark_jobs.api import ContinuousQuery

    totals = ContinuousQuery(spark, "SELECT k, SUM(v) AS total FROM events GROUP BY k").save_as("totals").create()
"""

from typing import Any

from spark_jobs.api import reads
from spark_jobs.api.ctas import ContinuousQuery, CtasError, RunningTable
from spark_jobs.api.lineage import register_lineage_views
from spark_jobs.api.reads import CoordinatorUnreachable, SnapshotError, open_snapshot
from spark_jobs.ops.hooks import JobEvent, JobHooks

__all__ = [
    "ConsistentSnapshot",
    "ContinuousQuery",
    "CoordinatorUnreachable",
    "CtasError",
    "JobEvent",
    "JobHooks",
    "RunningTable",
    "SnapshotError",
    "open_snapshot",
    "register_lineage_views",
]


def __getattr__(name: str) -> Any:
    return reads.__getattr__(name)  # ConsistentSnapshot: deprecated, warns
