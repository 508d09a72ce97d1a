"""Consistent reads without Spark: ``open_snapshot`` and ``query`` return Arrow tables read with
delta-rs and DataFusion in this process (no JVM, no pyspark), at the same read levels as
``spark_jobs.api.open_snapshot`` (docs/reads.md). ``lockstep query`` and ``lockstep serve`` (a
PostgreSQL-wire endpoint) read through it.

Example::

    from lockstep_reads import open_snapshot, query

    print(query("SELECT page, views FROM views_per_page ORDER BY page").table.to_pandas())
    with open_snapshot(["user_item_amount"], consistency="repeatable-read") as snap:
        first = snap.sql("SELECT SUM(total_amount) AS n FROM user_item_amount")
"""

from coordinator.client.snapshots import CoordinatorUnreachable, SnapshotError
from lockstep_reads.engine import QueryError
from lockstep_reads.snapshot import Result, Snapshot, open_snapshot, query
from lockstep_reads.statements import Refused, StatementError
from lockstep_reads.tables import UnreadableTable, VersionGone

__all__ = [
    "CoordinatorUnreachable",
    "QueryError",
    "Refused",
    "Result",
    "Snapshot",
    "SnapshotError",
    "StatementError",
    "UnreadableTable",
    "VersionGone",
    "open_snapshot",
    "query",
]
