"""The JVM's log lines of a stretch of a test, in a file the test can read.

The session's JVM writes its log to the stderr it was started with, which pytest's own capture
holds, not the test; so a test that searches what Spark logged adds a log4j2 file appender to
the root logger for as long as it needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession


@contextmanager
def jvm_log(spark: SparkSession, path: Path, level: str = "INFO", restore: str = "WARN") -> Iterator[Path]:
    """Every line the JVM logs at ``level`` and above goes to ``path`` too, inside the block."""
    jvm = spark._jvm
    assert jvm is not None
    core = jvm.org.apache.logging.log4j.core
    context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    config = context.getConfiguration()
    layout = core.layout.PatternLayout.newBuilder().withPattern("%d %p %c: %m%n").build()
    name = f"test-{path.name}"
    appender = core.appender.FileAppender.newBuilder().withFileName(str(path)).setName(name).setLayout(layout).build()
    appender.start()
    config.addAppender(appender)
    config.getRootLogger().addAppender(appender, None, None)
    context.updateLoggers()
    spark.sparkContext.setLogLevel(level)
    try:
        yield path
    finally:
        spark.sparkContext.setLogLevel(restore)
        config.getRootLogger().removeAppender(name)
        appender.stop()
        context.updateLoggers()
