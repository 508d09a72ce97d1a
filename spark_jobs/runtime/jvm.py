"""The Spark driver JVM's options, with a class data archive (CDS) when one was made.

A job process that starts again after a crash spends its first seconds loading and linking
some 25,000 classes of Spark, Delta and Scala. A dynamic CDS archive (JDK 13+) holds them
already parsed and verified: measured on a 2-core machine, a cold session, Delta write, MERGE
and read took 11.7 s with it against 15.6 s without (``bench.restart`` times whole restarts).
``scripts/setup`` makes the archive once (``spark_jobs.runtime.warmup``); every session built by
``session.build_session`` then maps it. An archive that does not fit the JVM or its class path
(another Java, a reinstalled pyspark, an extra driver class path) is ignored by the JVM, silently.

Example::

    options = driver_java_options(settings)   # "-Xss32m -XX:ReservedCodeCacheSize=240m -XX:SharedArchiveFile=... ..."
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from coordinator.settings import Settings

# Stopping a query while its foreachBatch runs makes Spark match a regex against the whole
# Python traceback (StreamExecution.isInterruptionException); with 1 MB thread stacks that
# overflows and prints thousands of lines. Deeper stacks let the stop end cleanly.
# The code cache is the tiered JIT's default size for every JVM: with C1 only
# (-XX:TieredStopAtLevel=1, for short-lived processes) the JVM reserves 48 MB, which Spark and
# Delta fill within a minute of barriers. The JIT then stops for good, everything new runs
# interpreted (the kill -9 drill: 155 s at 240 MB, 168 s at 48 MB, 227 s at 24 MB), and a method handle
# the full cache has no room for is a VirtualMachineError, which Spark answers by exiting the JVM.
BASE_OPTIONS = "-Xss32m -XX:ReservedCodeCacheSize=240m"
# an archive the JVM cannot use is no error: it runs without, and says nothing
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"
# Loggers whose warnings say nothing a Lockstep user can act on (their errors still show): a
# barrier's micro-batch taking longer than the query's trigger interval is normal (the trigger
# only asks for barriers); each job's scheduler pool is made on first use, with the defaults, on
# purpose; a stopped query's cancellation of its job group finds nothing to cancel between
# batches; Hadoop's native library is an optimisation Lockstep does not need; Spark truncates
# the plan it describes to its listeners at every query (printing it whole would cost each
# barrier more) and says so once per process.
QUIET_LOGGERS = ("org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor",
                 "org.apache.spark.scheduler.FairSchedulableBuilder",
                 "org.apache.spark.scheduler.DAGScheduler",
                 "org.apache.hadoop.util.NativeCodeLoader",
                 "org.apache.spark.util.SparkStringUtils")


def archive_path(settings: Settings) -> Path:
    """Where the archive of this Java, this pyspark install and these jars lives (in the jar cache)."""
    import pyspark

    wheel_jars = Path(pyspark.__file__).parent / "jars"
    java = shutil.which("java") or ""
    parts = [os.environ.get("JAVA_HOME", ""), os.path.realpath(java) if java else "", str(wheel_jars),
             str(wheel_jars.stat().st_mtime_ns) if wheel_jars.exists() else "",
             *sorted(p.name for p in (settings.jars / "spark").glob("*.jar"))]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return settings.jars / "jvm" / f"spark-{key}.jsa"


def log_config(settings: Settings) -> Path:
    """The driver's log4j2 configuration, written under ``LOCKSTEP_HOME`` when it changed: Spark's
    console format at WARN, the ``QUIET_LOGGERS`` at ERROR. A configuration of our own also keeps
    Spark from printing its "default log4j profile" banner into every job's output."""
    lines = ["# made by Lockstep (spark_jobs.runtime.jvm): the Spark driver's logging", "rootLogger.level = warn",
             "rootLogger.appenderRef.console.ref = console", "appender.console.type = Console",
             "appender.console.name = console", "appender.console.target = SYSTEM_ERR",
             "appender.console.layout.type = PatternLayout",
             "appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex"]
    for i, name in enumerate(QUIET_LOGGERS):
        lines += [f"logger.quiet{i}.name = {name}", f"logger.quiet{i}.level = error"]
    text = "\n".join(lines) + "\n"
    path = settings.home / "spark" / "log4j2.properties"
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def driver_java_options(settings: Settings) -> str:
    """``spark.driver.extraJavaOptions``: the base options, the log configuration, the class
    archive if there is one, and ``LOCKSTEP_DRIVER_JVM_OPTIONS``."""
    archive = archive_path(settings)
    options = [BASE_OPTIONS, f"-Dlog4j2.configurationFile={log_config(settings).absolute()}"]
    if archive.is_file():
        options.append(f"-XX:SharedArchiveFile={archive.absolute()} {QUIET_CDS}")
    if settings.driver_jvm_options:  # LOCKSTEP_DRIVER_JVM_OPTIONS
        options.append(settings.driver_jvm_options)
    return " ".join(options)
