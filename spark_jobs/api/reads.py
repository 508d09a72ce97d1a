"""Deprecated: Spark users read through the one front door, ``lockstep_reads.open_snapshot``,
given their session (``open_snapshot(tables, ..., spark=spark)``: Spark SQL, DataFrames, the
same read levels, lease and errors as every other reader). ``open_snapshot(spark, ...)`` and
``ConsistentSnapshot`` stay for one release and warn (``DeprecationWarning``).

Example::

    from lockstep_reads import open_snapshot

    with open_snapshot(["user_item_amount", "user_item_price"], spark=spark) as snap:
        snap.sql("SELECT ... FROM user_item_amount JOIN user_item_price USING (user_id, item_id)").show()
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from coordinator.client.snapshots import CoordinatorUnreachable, SnapshotError, close_clients
from coordinator.domain.snapshot import ReadLevel
from coordinator.settings import Settings
from lockstep_reads.snapshot import Snapshot
from lockstep_reads.snapshot import open_snapshot as _open_snapshot
from lockstep_reads.spark import referenced_tables

__all__ = ["CoordinatorUnreachable", "SnapshotError", "close_clients", "open_snapshot",
           "referenced_tables"]


def open_snapshot(
    spark: SparkSession,
    tables: Sequence[str] | None = None,
    consistency: str = ReadLevel.READ_COMMITTED,
    as_of_barrier: int | None = None,
    as_of_timestamp: int | None = None,
    settings: Settings | None = None,
    lease_ttl_ms: int = 30_000,
) -> Snapshot[DataFrame]:
    """Deprecated: ``lockstep_reads.open_snapshot(tables, ..., spark=spark)``."""
    warnings.warn("spark_jobs.api.open_snapshot(spark, tables, ...) is deprecated and goes in the next release: "
                  "use lockstep_reads.open_snapshot(tables, ..., spark=spark)", DeprecationWarning, stacklevel=2)
    return _open_snapshot(tables, consistency, as_of_barrier, as_of_timestamp, settings, lease_ttl_ms, spark=spark)


def __getattr__(name: str) -> Any:
    if name == "ConsistentSnapshot":
        warnings.warn("spark_jobs.api.ConsistentSnapshot is deprecated and goes in the next release: it is "
                      "lockstep_reads.Snapshot", DeprecationWarning, stacklevel=2)
        return Snapshot
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
