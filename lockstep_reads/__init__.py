"""Consistent reads, one front door for every engine: ``open_snapshot`` pins each table's Delta
version for the read level, and reads them with delta-rs and DataFusion in this process (Arrow
tables, no JVM, no pyspark), or with a SparkSession when given one (``spark=``: DataFrames).
``query`` is one query at one snapshot. ``lockstep query`` and ``lockstep serve`` (a
PostgreSQL-wire endpoint) read through it (docs/reads.md).

Example::

    from lockstep_reads import open_snapshot, query

    print(query("SELECT page, views FROM views_per_page ORDER BY page").table.to_pandas())
    with open_snapshot(["user_item_amount"], consistency="repeatable-read") as snap:
        first = snap.sql("SELECT SUM(total_amount) AS n FROM user_item_amount")
    with open_snapshot(["user_item_amount"], spark=spark) as snap:
        snap.table("user_item_amount").show()

Errors: ``SnapshotError`` (and ``CoordinatorUnreachable``, ``VersionGone``, ``UnreadableTable``)
when the snapshot cannot be read, ``StatementError`` (and ``QueryError``, ``Refused``) when the
SQL cannot run; all are ``LockstepError``.
"""

from coordinator.client.snapshots import CoordinatorUnreachable, SnapshotError
from lockstep_reads.snapshot import Engine, Result, Snapshot, open_snapshot, query
from lockstep_reads.statements import QueryError, Refused, StatementError
from lockstep_reads.tables import UnreadableTable, VersionGone

__all__ = [
    "CoordinatorUnreachable",
    "Engine",
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
