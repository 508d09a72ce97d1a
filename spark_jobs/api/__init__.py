"""What Spark users call: consistent snapshots, the CTAS builder, lineage views, job hooks.

Example::

    from spark_jobs.api import open_snapshot

    with open_snapshot(spark, ["user_item_amount", "user_item_price"]) as snap:
        snap.sql("SELECT ... FROM user_item_amount JOIN user_item_price USING (user_id, item_id)").show()
"""

from spark_jobs.api.ctas import ContinuousQuery, CtasError
from spark_jobs.api.lineage import register_lineage_views
from spark_jobs.api.reads import ConsistentSnapshot, CoordinatorUnreachable, SnapshotError, open_snapshot
from spark_jobs.ops.hooks import JobEvent, JobHooks

__all__ = [
    "ConsistentSnapshot",
    "ContinuousQuery",
    "CoordinatorUnreachable",
    "CtasError",
    "JobEvent",
    "JobHooks",
    "SnapshotError",
    "open_snapshot",
    "register_lineage_views",
]
