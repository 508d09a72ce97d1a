"""Every Delta feature Lockstep's Spark writes, read without Spark: each fixture is a real table
written by Spark with Lockstep's session settings, and its versions (the first with rows, one
between, the newest) must read through delta-rs + DataFusion as the same rows Spark reads at
that version. A feature the light path is not checked for is refused with its name, never read
into wrong rows."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType, TimestampType

from coordinator.settings import Settings
from lockstep.dev.s3 import LocalS3
from lockstep_reads.engine import run_query
from lockstep_reads.tables import TableVersions, UnreadableTable, VersionGone
from tests.support import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def sql_each(spark: SparkSession, path: str, statements: list[str]) -> None:
    for statement in statements:
        spark.sql(statement.format(t=f"delta.`{path}`"))


# name -> the statements that write it, each a version ({t}: the table)
FIXTURES: dict[str, list[str]] = {
    "types_and_nulls": [
        "CREATE TABLE {t} (k BIGINT, i INT, s STRING, d DECIMAL(10, 2), f DOUBLE, b BOOLEAN, day DATE, ts TIMESTAMP, "
        "ntz TIMESTAMP_NTZ, bin BINARY, xs ARRAY<INT>, st STRUCT<a: INT, b: STRING>, m MAP<STRING, INT>) USING delta",
        "INSERT INTO {t} VALUES (1, 2, 'é', 1.25, 0.5, true, DATE'2026-01-02', TIMESTAMP'2026-01-02 03:04:05.123456', "
        "TIMESTAMP_NTZ'2026-01-02 03:04:05', X'00ff', array(1, NULL, 3), named_struct('a', 1, 'b', 'x'), map('k', 1))",
        "INSERT INTO {t} VALUES (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    ],
    "deletion_vectors": [
        "CREATE TABLE {t} (k BIGINT, v STRING) USING delta TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')",
        "INSERT INTO {t} SELECT id, CAST(id AS STRING) FROM range(100)",
        "DELETE FROM {t} WHERE k % 7 = 0",
        "UPDATE {t} SET v = 'updated' WHERE k % 5 = 0",
    ],
    "column_mapping_by_name": [
        "CREATE TABLE {t} (k BIGINT, old_name STRING, gone STRING) USING delta "
        "TBLPROPERTIES ('delta.columnMapping.mode' = 'name', 'delta.enableChangeDataFeed' = 'false')",
        "INSERT INTO {t} VALUES (1, 'a', 'x'), (2, 'b', 'y')",
        "ALTER TABLE {t} RENAME COLUMN old_name TO new_name",
        "ALTER TABLE {t} DROP COLUMN gone",
        "INSERT INTO {t} VALUES (3, 'c')",
    ],
    "column_mapping_by_id": [
        "CREATE TABLE {t} (k BIGINT, v STRING) USING delta "
        "TBLPROPERTIES ('delta.columnMapping.mode' = 'id', 'delta.enableChangeDataFeed' = 'false')",
        "INSERT INTO {t} VALUES (1, 'a'), (2, 'b')",
        "ALTER TABLE {t} RENAME COLUMN v TO w",
    ],
    "checkpoints": [
        "CREATE TABLE {t} (k BIGINT, v BIGINT) USING delta TBLPROPERTIES ('delta.checkpointInterval' = '2')",
        *[f"INSERT INTO {{t}} VALUES ({i}, {i * i})" for i in range(6)],
        "DELETE FROM {t} WHERE k = 2",
    ],
    "v2_checkpoints": [
        "CREATE TABLE {t} (k BIGINT) USING delta "
        "TBLPROPERTIES ('delta.checkpointPolicy' = 'v2', 'delta.checkpointInterval' = '2')",
        *[f"INSERT INTO {{t}} VALUES ({i})" for i in range(4)],
    ],
    "merge_with_change_data": [  # MERGE's files carry the change feed's columns: never shown
        "CREATE TABLE {t} (k BIGINT, v BIGINT) USING delta TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')",
        "INSERT INTO {t} SELECT id, id FROM range(20)",
        "MERGE INTO {t} t USING (SELECT id AS k, id * 10 AS v FROM range(10, 30)) s ON t.k = s.k "
        "WHEN MATCHED AND s.k % 3 = 0 THEN DELETE WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *",
    ],
    "partitioned": [
        "CREATE TABLE {t} (k BIGINT, p STRING, day DATE) USING delta PARTITIONED BY (p, day)",
        "INSERT INTO {t} VALUES (1, 'x', DATE'2026-01-01'), (2, 'y', NULL), (3, NULL, DATE'2026-01-02')",
    ],
    "bookkeeping_columns": [  # an aggregate's hidden sums and counts (__lockstep_*): never shown
        "CREATE TABLE {t} (page STRING, views BIGINT, __lockstep_rows BIGINT, __lockstep_sum_ms BIGINT) USING delta",
        "INSERT INTO {t} VALUES ('/a', 2, 2, 300), ('/b', 1, 1, 50)",
    ],
}


def plain(value: Any, timestamp: bool) -> Any:
    """A value as both sides can be compared: Spark's instants are naive local times, Arrow's
    are UTC-aware; Arrow's maps are lists of pairs; Spark's structs are Rows."""
    if isinstance(value, dt.datetime) and timestamp:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if hasattr(value, "asDict"):
        return {k: plain(v, False) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {k: plain(v, False) for k, v in value.items()}
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return {k: v for k, v in value}
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, Decimal):
        return str(value)
    return value


def spark_rows(spark: SparkSession, path: str, version: int) -> list[dict[str, Any]]:
    frame = spark.read.format("delta").option("versionAsOf", version).load(path)
    schema: StructType = frame.schema
    instants = {f.name for f in schema.fields if isinstance(f.dataType, TimestampType)}
    visible = [f.name for f in schema.fields if not f.name.startswith("__lockstep_")]
    return [{c: plain(r[c], c in instants) for c in visible} for r in frame.collect()]


def light_rows(versions: TableVersions, path: str, version: int) -> list[dict[str, Any]]:
    table = run_query("SELECT * FROM t", {"t": versions.open(path, version)})
    instants = {f.name for f in table.schema if str(f.type).startswith("timestamp") and f.type.tz is not None}
    return [{c: plain(v, c in instants) for c, v in row.items()} for row in table.to_pylist()]


def canonical(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(repr(sorted(r.items())) for r in rows)


@pytest.fixture
def write_fixture(spark: SparkSession, tmp_path: Path) -> Callable[[str, str | None], tuple[str, int]]:
    """Factory: ``write_fixture(name, root)`` writes FIXTURES[name] under ``root`` (default: a
    folder) and returns the table's location and newest version."""

    def write(name: str, root: str | None = None) -> tuple[str, int]:
        path = f"{root or tmp_path}/{name}_{uuid.uuid4().hex[:6]}"
        sql_each(spark, path, FIXTURES[name])
        return path, len(FIXTURES[name]) - 1

    return write


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_version_reads_as_spark_reads_it(name: str, spark: SparkSession, write_fixture: Callable,
                                               base_settings: Settings) -> None:
    path, newest = write_fixture(name)
    versions = TableVersions(base_settings)
    # the first version with rows, one between (after a checkpoint, a rename, a delete) and the newest
    for version in sorted({1, (newest + 2) // 2, newest}):
        expected = spark_rows(spark, path, version)
        got = light_rows(versions, path, version)
        assert canonical(got) == canonical(expected), f"{name} version {version}"
        if got:
            assert list(got[0]) == list(expected[0]), "the same columns, in the same order"
    assert not any(c.startswith("__") or c == "_change_type" for c in light_rows(versions, path, newest)[0])


def test_an_s3a_warehouse_reads_through_the_s3_api(spark: SparkSession, write_fixture: Callable, local_s3: LocalS3,
                                                   base_settings: Settings) -> None:
    from spark_jobs.runtime.session import configure_storage

    settings = Settings.from_env({**local_s3.env(), "LOCKSTEP_WAREHOUSE": "s3a://lake/wh"})
    configure_storage(spark, settings)
    path, newest = write_fixture("deletion_vectors", "s3a://lake/wh")
    assert path.startswith("s3a://lake/wh/")
    versions = TableVersions(settings)
    for version in (1, newest):
        assert canonical(light_rows(versions, path, version)) == canonical(spark_rows(spark, path, version))
    # no credentials, no read: the error says so instead of returning nothing
    with pytest.raises(Exception, match="(?i)cannot open|403|denied|credential|signature"):
        TableVersions(Settings.from_env({"LOCKSTEP_S3_ENDPOINT": settings.s3.endpoint or ""})).open(path, newest)


def test_a_feature_the_reader_is_not_checked_for_is_refused_by_name(spark: SparkSession, tmp_path: Path,
                                                                     base_settings: Settings) -> None:
    path = str(tmp_path / "widened")
    sql_each(spark, path, ["CREATE TABLE {t} (k INT) USING delta TBLPROPERTIES ('delta.enableTypeWidening' = 'true')",
                           "INSERT INTO {t} VALUES (1)",
                           "ALTER TABLE {t} CHANGE COLUMN k TYPE BIGINT",
                           "INSERT INTO {t} VALUES (3000000000)"])
    with pytest.raises(UnreadableTable, match="'widened' uses the Delta feature.*typeWidening.*through Spark"):
        TableVersions(base_settings).open(path, 3, "widened")


def test_a_vacuumed_version_is_named_as_gone(spark: SparkSession, write_fixture: Callable, base_settings: Settings) -> None:
    path, newest = write_fixture("checkpoints")
    for log in Path(path, "_delta_log").glob("0000000000000000000[0-3].json"):
        log.unlink()  # what log cleanup does to versions older than a checkpoint
    with pytest.raises(VersionGone, match="version 1 is no longer available"):
        TableVersions(base_settings).open(path, 1, "t")
    assert TableVersions(base_settings).open(path, newest).version() == newest


def test_the_light_path_imports_no_pyspark_and_starts_no_jvm(spark: SparkSession, write_fixture: Callable) -> None:
    path, newest = write_fixture("deletion_vectors")
    script = (
        "import sys\n"
        "for name in ('pyspark', 'py4j', 'delta'):\n"
        "    sys.modules[name] = None  # importing any of them now fails\n"
        "import lockstep_reads\n"
        "from coordinator.settings import Settings\n"
        "from lockstep_reads.engine import run_query\n"
        "from lockstep_reads.tables import TableVersions\n"
        f"t = TableVersions(Settings()).open({path!r}, {newest})\n"
        "print(run_query('SELECT COUNT(*) AS n FROM t', {'t': t}).to_pylist())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[{'n': 85}]"
