"""Table names in a Hive metastore (``LOCKSTEP_METASTORE``): each job registers its table, and
its dead-letter table, as an external Delta table at its location once the table exists, so
``spark.table("shopping")`` and ``SELECT * FROM shopping`` work in any Spark session configured
for the same metastore. Such a plain read sees each table's newest version on its own (read
uncommitted: two tables may stand at different barriers); consistent reads go through
``open_snapshot``, which reads the versions of one barrier by location. Without a metastore
tables are known by location only and these functions do nothing.

Example::

    register_table(spark, "shopping", settings.table_location("shopping"))
    spark.table("shopping").count()
"""

from __future__ import annotations

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession


def has_catalog(spark: SparkSession) -> bool:
    """Whether the session's catalog is a Hive metastore (``Settings.catalog_conf``)."""
    return spark.conf.get("spark.sql.catalogImplementation", "in-memory") == "hive"


def register_table(spark: SparkSession, name: str, location: str) -> bool:
    """Name the Delta table at ``location`` ``name`` in the metastore, unless it is named
    already; True if the session has a metastore. Two processes racing to register the same
    table both succeed."""
    if not has_catalog(spark):
        return False
    quoted = location.replace("\\", "\\\\").replace("'", "\\'")
    try:
        spark.sql(f"CREATE TABLE IF NOT EXISTS `{name}` USING DELTA LOCATION '{quoted}'")
    except AnalysisException as exc:
        if "already exists" not in str(exc).lower():
            raise
    return True


def forget_table(spark: SparkSession, name: str) -> None:
    """Remove ``name`` from the metastore (only the name: the files are the caller's to remove)."""
    if has_catalog(spark):
        spark.sql(f"DROP TABLE IF EXISTS `{name}`")
