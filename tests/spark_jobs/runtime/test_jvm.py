"""The Spark driver's JVM options: the class archive ``scripts/setup`` makes, and the user's own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from spark_jobs.runtime.jvm import archive_path, driver_java_options


def test_the_archive_is_named_only_once_it_exists_and_the_users_options_come_last(tmp_path: Path) -> None:
    settings = Settings(jars=tmp_path / "jars", driver_jvm_options="-XX:TieredStopAtLevel=1")
    assert driver_java_options(settings) == "-Xss32m -XX:TieredStopAtLevel=1"
    archive = archive_path(settings)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"archive")
    options = driver_java_options(settings).split()
    assert options[0] == "-Xss32m" and options[-1] == "-XX:TieredStopAtLevel=1"
    assert f"-XX:SharedArchiveFile={archive.absolute()}" in options
    assert "-Xlog:cds=off" in options  # an archive the JVM cannot use is skipped without a word


def test_another_jar_set_has_another_archive(tmp_path: Path) -> None:
    settings = Settings(jars=tmp_path / "jars")
    (tmp_path / "jars" / "spark").mkdir(parents=True)
    before = archive_path(settings)
    (tmp_path / "jars" / "spark" / "delta-spark_2.13-9.9.9.jar").write_bytes(b"")
    assert archive_path(settings) != before


@pytest.mark.integration
def test_the_test_sessions_driver_maps_the_archive_setup_made(spark: SparkSession, base_settings: Settings) -> None:
    archive = archive_path(dataclasses.replace(base_settings, driver_jvm_options=""))
    assert archive.is_file(), "scripts/setup makes the class archive (python -m spark_jobs.runtime.warmup)"
    jvm = spark._jvm  # type: ignore[attr-defined]
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={archive.absolute()}" in arguments
    assert "sharing" in jvm.java.lang.System.getProperty("java.vm.info")
