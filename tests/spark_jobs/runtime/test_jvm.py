"""The Spark driver's JVM options: its log configuration, the class archive ``scripts/setup``
makes, and the user's own."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from spark_jobs.runtime.jvm import QUIET_LOGGERS, archive_path, driver_java_options, log_config


def test_the_archive_is_named_only_once_it_exists_and_the_users_options_come_last(tmp_path: Path) -> None:
    settings = Settings(jars=tmp_path / "jars", home=tmp_path / "home", driver_jvm_options="-XX:TieredStopAtLevel=1")
    logging = f"-Dlog4j2.configurationFile={(tmp_path / 'home' / 'spark' / 'log4j2.properties').absolute()}"
    assert driver_java_options(settings) == f"-Xss32m -XX:ReservedCodeCacheSize=240m {logging} -XX:TieredStopAtLevel=1"
    archive = archive_path(settings)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"archive")
    options = driver_java_options(settings).split()
    assert options[:2] == ["-Xss32m", "-XX:ReservedCodeCacheSize=240m"] and options[-1] == "-XX:TieredStopAtLevel=1"
    assert f"-XX:SharedArchiveFile={archive.absolute()}" in options
    assert "-Xlog:cds=off" in options  # an archive the JVM cannot use is skipped without a word


def test_the_log_configuration_quiets_what_users_cannot_act_on_and_is_written_once(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    path = log_config(settings)
    text = path.read_text()
    assert "rootLogger.level = warn" in text and "appender.console.target = SYSTEM_ERR" in text
    for i, name in enumerate(QUIET_LOGGERS):
        assert f"logger.quiet{i}.name = {name}\nlogger.quiet{i}.level = error" in text
    written = path.stat().st_mtime_ns
    assert log_config(settings) == path and path.stat().st_mtime_ns == written  # unchanged: not written again


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
    # and it logs as Lockstep's configuration says: what users cannot act on only from ERROR on
    assert any(a.startswith("-Dlog4j2.configurationFile=") for a in arguments)
    manager = jvm.org.apache.logging.log4j.LogManager
    assert all(str(manager.getLogger(name).getLevel()) == "ERROR" for name in QUIET_LOGGERS)


@pytest.mark.integration
def test_a_c1_only_driver_keeps_the_tiered_code_cache(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", jars=tmp_path / "jars", driver_jvm_options="-XX:TieredStopAtLevel=1")
    flags = subprocess.run(["java", *driver_java_options(settings).split(), "-XX:+PrintFlagsFinal", "-version"],
                           capture_output=True, text=True, check=True).stdout
    size = next(line.split()[3] for line in flags.splitlines() if " ReservedCodeCacheSize " in line)
    assert int(size) == 240 * 2**20  # not C1's own 48 MB, which Spark fills within a minute
