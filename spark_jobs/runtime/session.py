"""Build the SparkSession every Lockstep job and test uses.

Delta's SQL extension and catalog are on, the Delta/Kafka/Avro jars come from the local
cache that ``scripts/setup`` fills (``spark.jars``: nothing is downloaded at start), and the
defaults suit a 2-core machine. On a cluster, pass ``master`` and ``conf`` (or set
``LOCKSTEP_SPARK_MASTER``) and ship the same jars with spark-submit.

Example::

    from spark_jobs.runtime.session import build_session
    spark = build_session("my-job")
    spark.range(3).write.format("delta").save("/tmp/t")
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from py4j.protocol import Py4JNetworkError
from pyspark.sql import SparkSession

from coordinator.domain.errors import LockstepError, NotStarted
from coordinator.settings import Settings
from spark_jobs.runtime.jvm import QUIET_LOGGERS, driver_java_options

# Small-machine defaults; every key can be overridden through ``conf``.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    # Servers bind to loopback only on a developer machine.
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    "spark.sql.session.timeZone": "UTC",
    # A barrier's work is small and latency-bound: every Spark job costs scheduling and planning
    # on the driver. Adaptive execution splits each shuffle into a job of its own (a Delta
    # snapshot's state took 3 jobs instead of 1), and one partition holds a small table's log.
    "spark.sql.adaptive.enabled": "false",
    # A version read from its checksum's file list (``delta_log.read_version``, up to 50 files) is
    # listed on the driver: above 32 paths Spark listed them with a Spark job of its own (0.1-0.3 s).
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "64",
    # Such a read is plain Parquet: Delta's file statistics do not skip files for it, only each
    # row group's own statistics do, and Spark keeps none for its default INT96 timestamps. As
    # INT64 microseconds (what Delta's protocol calls a timestamp too) a time-range read of a
    # window's rows skips the row groups of other times (docs/performance.md: q7 at 50M events).
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.databricks.delta.snapshotPartitions": "1",
    # Where the JVM's time zone is not UTC (most users' machines), Delta checks the file list it
    # keeps in each commit's checksum against a full reconstruction of the table's state, a few
    # Spark jobs in every commit (a barrier's append of 4,600 rows: 504 ms instead of 202 ms;
    # docs/decisions/0001-delta-4-4.md). The check is a diagnostic Delta forces there for
    # timestamps before 1883 in non-UTC zones; Lockstep's sessions compute in UTC, so it is left off.
    "spark.databricks.delta.allFilesInCrc.verificationMode.forceOnNonUTC.enabled": "false",
    # a histogram of file sizes is one more aggregate in every reconstruction of a table's state
    # (before every barrier's write); nothing of Lockstep's reads it
    "spark.databricks.delta.fileSizeHistogramMetrics.enabled": "false",
    "spark.databricks.delta.properties.defaults.enableChangeDataFeed": "true",
    # Which versions stay readable is Lockstep's vacuum's decision (leases, jobs, retained
    # barriers; ``spark_jobs.ops.vacuum``), not Delta's deletedFileRetentionDuration: a leased
    # exact point older than that horizon must still read.
    "spark.databricks.delta.vacuum.enforceTimeTravelWithinDeletedFileRetentionDuration": "false",
    # Jobs sharing an application take turns task by task (each job has its own pool, set by
    # the runner), instead of first come, first served: under FIFO an aggregate's barrier of a
    # few small tasks waited for all the root job's tasks of the next barrier.
    "spark.scheduler.mode": "FAIR",
    # stopping a query waits this long for its micro-batch to end (Spark's default: for ever), so a
    # hung one cannot hold up a runner's stop or the watchdog's restart of it
    "spark.sql.streaming.stopTimeout": "60s",
    # Spark 4.2.0 hands a Python UDF (Arrow-optimized, the default) its input straight from a
    # columnar scan such as Delta's in a message its Python worker misreads (SPARK-58241, fixed
    # after 4.2.0): the worker crashes or waits for ever. Off, the input goes row by row as before.
    "spark.sql.execution.arrow.pythonUDF.columnarInput.enabled": "false",
    # PySpark 4 wraps every DataFrame and Column call to record its Python call site for error
    # messages: an active-session lookup, a conf read and a stack walk each time, and each asks
    # the JVM for classes by short names (failed class loads). A barrier's plan makes hundreds
    # of such calls per table (docs/performance.md: the profile of a barrier)
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # the compiled code of this many query shapes is kept (Spark's default, 100, is fewer than a
    # pipeline of tens of tables runs: each shape evicted is compiled again at its next barrier)
    "spark.sql.codegen.cache.maxEntries": "1000",
}

# In local mode the driver's own executor heartbeats the driver. Its first heartbeat may come
# before the SparkContext has registered it (a session starting on a busy machine): the driver
# then asks it to re-register, which fails and logs a NullPointerException; and a heartbeat
# late past the expiry (a long pause) makes every later one fail until the JVM exits. Heartbeats
# carry nothing Lockstep needs locally (task metrics for a UI that is off), so they come rarely
# and never expire.
LOCAL_CONF: dict[str, str] = {
    "spark.executor.heartbeatInterval": "60s",
    "spark.storage.blockManagerHeartbeatTimeoutMs": "3600s",
}

# Every table this session creates keeps its log entries this long (LOCKSTEP_LOG_RETENTION_HOURS,
# Delta's default is 30 days): older ones go at the table's next checkpoint, so the log of a
# table committed every barrier for weeks stays bounded (``delta_log.prepare_next_write``).
# Delta rounds the cut-off down to midnight (UTC), so up to a day more is kept.
# Delta wants its own vacuum horizon no longer than that; Lockstep's vacuum does not use it (it
# deletes from its own inventory), so both get the same value.
LOG_RETENTION_DEFAULT = "spark.databricks.delta.properties.defaults.logRetentionDuration"
RETENTION_DEFAULTS = (LOG_RETENTION_DEFAULT, "spark.databricks.delta.properties.defaults.deletedFileRetentionDuration")

class SparkSetupError(NotStarted):
    """Spark cannot start as configured; the message says how to fix it."""


def spark_jars(settings: Settings, object_store: bool | None = None) -> list[Path]:
    """The cached extra jars (Delta, Kafka, Avro; with ``object_store``, default: whether the
    warehouse is a URI, also the s3a:// file system), or a clear error if setup has not run."""
    folder = settings.jars / "spark"
    jars = sorted(folder.glob("*.jar"))
    if not any(j.name.startswith("delta-spark_") for j in jars):
        raise SparkSetupError(
            f"no Delta jars in {folder.absolute()}. {settings.installed.where_jars()}"
        )
    if object_store if object_store is not None else not settings.warehouse_is_local:
        s3a = sorted((settings.jars / "s3a").glob("*.jar"))
        if not any(j.name.startswith("hadoop-aws-") for j in s3a):
            raise SparkSetupError(f"no hadoop-aws jars in {(settings.jars / 's3a').absolute()} for the warehouse "
                                  f"{settings.warehouse}. {settings.installed.where_jars()}")
        jars += s3a
    return jars


def catalog_conf(settings: Settings) -> dict[str, str]:
    """``Settings.catalog_conf`` plus, for a Derby metastore, its JDBC client on the driver's
    class path (the metastore client's DataNucleus finds drivers there only, not in ``spark.jars``)."""
    conf = settings.catalog_conf()
    if settings.metastore.startswith("jdbc:derby:"):
        client = sorted((settings.jars / "derby").glob("derbyclient-*.jar"))
        if not client:
            raise SparkSetupError(f"no Derby client jar in {(settings.jars / 'derby').absolute()} for the metastore "
                                  f"{settings.metastore}. {settings.installed.where_jars()}")
        conf["spark.driver.extraClassPath"] = str(client[-1].absolute())
    return conf


def build_session(
    app_name: str = "lockstep",
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    settings: Settings | None = None,
    object_store: bool | None = None,
) -> SparkSession:
    """Get or create the SparkSession with Delta, the cached jars and small-machine defaults
    (``object_store``: load the s3a:// jars even if ``settings``' warehouse is a folder); with
    ``LOCKSTEP_METASTORE`` its catalog is that Hive metastore (``spark_jobs.runtime.catalog``)."""
    settings = settings or Settings.from_env()
    # Python workers (UDFs, Python data sources) must run the interpreter that has our deps.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    local: dict[str, str] = {}
    if master or not launched_by_spark_submit():  # spark-submit's --master decides for the processes it starts
        builder = builder.master(master or settings.spark_master)
        local = LOCAL_CONF if (master or settings.spark_master).startswith("local") else {}
    builder = (
        builder
        .config("spark.jars", ",".join(str(j.absolute()) for j in spark_jars(settings, object_store)))
        .config("spark.sql.warehouse.dir", settings.table_location("").rstrip("/"))
    )
    retention = dict.fromkeys(RETENTION_DEFAULTS, f"interval {settings.log_retention_hours} hours")
    s3 = {f"spark.hadoop.{key}": value for key, value in settings.s3.hadoop_conf().items()}
    jvm = {"spark.driver.extraJavaOptions": driver_java_options(settings)}  # deep stacks, the class archive
    for key, value in {**DEFAULT_CONF, **local, **jvm, **retention, **s3, **catalog_conf(settings), **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.spark_log_level or "WARN")
    _quiet(spark, QUIET_LOGGERS)  # also where the driver did not start with ``jvm.log_config`` (spark-submit)
    _quiet_after_jvm_exit(spark)
    configure_storage(spark, settings)
    return spark


def _quiet_after_jvm_exit(spark: SparkSession) -> None:
    """Once the driver JVM exited, pyspark's threads that talk to it print tracebacks: its
    accumulator server when the JVM's end of its connection closes (an EOF there, which only the
    JVM's exit brings, is not printed), py4j's callback server for the Python code (a
    foreachBatch) the JVM was running, and py4j's client for a call it could not send (on the
    root logger). ``lockstep run`` says in one line that the JVM exited (``jvm_exited_error``);
    while it runs, py4j's errors are printed as before."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None and not getattr(server, "quiet_on_eof", False):
        loud = server.handle_error

        def handle_error(request: object, client_address: object) -> None:
            if not isinstance(sys.exc_info()[1], EOFError):
                loud(request, client_address)

        server.handle_error, server.quiet_on_eof = handle_error, True
    for logger in (logging.getLogger("py4j.java_gateway"), logging.getLogger("py4j.clientserver"), logging.getLogger()):
        logger.filters = [f for f in logger.filters if not isinstance(f, _WhileJvmRuns)]
        logger.addFilter(_WhileJvmRuns(spark))


class _WhileJvmRuns(logging.Filter):
    """Lets a record through only while ``spark``'s driver JVM runs."""

    def __init__(self, spark: SparkSession) -> None:
        super().__init__()
        self.spark = spark

    def filter(self, record: logging.LogRecord) -> bool:
        # the connection closes a moment before the JVM has exited: a lost connection waits for it
        lost = record.exc_info is not None and isinstance(record.exc_info[1], (Py4JNetworkError, ConnectionError))
        return driver_exit_code(self.spark, wait=3.0 if lost else 0.0) is None


def configure_storage(spark: SparkSession, settings: Settings) -> None:
    """Point a running session at the warehouse's object store (``LOCKSTEP_S3_*``): a session
    that existed before (``getOrCreate`` returns it as it is) or that the caller built gets the
    same ``fs.s3a.*`` settings a new one gets at start. Spark ships the driver's Hadoop
    configuration with every task, so executors read and write the store the same way."""
    hadoop = spark._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    for key, value in settings.s3.hadoop_conf().items():
        hadoop.set(key, value)


def session_running() -> bool:
    """Whether this process has a SparkContext already (``build_session`` would return its session):
    a command stops only a session it started."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None


def driver_exit_code(spark: SparkSession, wait: float = 0.0) -> int | None:
    """The exit code of the driver JVM this process started, once it has exited (within ``wait``
    seconds); None while it runs, or when another process started it (spark-submit). Spark
    exits its JVM on a fatal error in any of its threads (a VirtualMachineError such as an
    OutOfMemoryError), and every call into it fails from then on: callers ask this to say so
    instead of failing on each call. Its connections close a moment before it has exited: a
    caller that just lost one waits a little.

    Example::

        if (code := driver_exit_code(spark)) is not None:
            raise LockstepError(f"Spark's JVM exited with code {code}")
    """
    proc = getattr(spark.sparkContext._gateway, "proc", None)  # type: ignore[attr-defined]
    if proc is None:
        return None
    try:
        return proc.wait(wait) if wait > 0 else proc.poll()
    except subprocess.TimeoutExpired:
        return None


def stop_session(spark: SparkSession) -> None:
    """Stop ``spark`` unless its JVM exited already (a stop would fail on the closed connection
    and hide why it exited)."""
    if driver_exit_code(spark) is None:
        spark.stop()


def jvm_exited_error(code: int) -> LockstepError:
    """What ``lockstep run`` says when Spark's driver JVM exited under its jobs."""
    if code < 0:
        how = f"was killed by signal {-code}"
    else:
        why = {52: "out of memory: give the driver more, e.g. --conf spark.driver.memory=4g",
               50: "a fatal error in one of its threads, above"}.get(code, "its last error is above")
        how = f"exited with code {code} ({why})"
    return LockstepError(f"Spark's driver JVM {how}, and every job with it; running the pipeline again "
                         "continues each job from its last committed barrier")


def launched_by_spark_submit() -> bool:
    """Whether this Python process is a driver spark-submit started (it hands the driver the
    address of the JVM it started already)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _quiet(spark: SparkSession, loggers: tuple[str, ...]) -> None:
    """Only errors from ``loggers`` (log4j2, through the JVM)."""
    log4j = spark._jvm.org.apache.logging.log4j  # type: ignore[union-attr]
    for name in loggers:
        log4j.core.config.Configurator.setLevel(name, log4j.Level.ERROR)


@contextmanager
def session_conf(spark: SparkSession, conf: Mapping[str, str]) -> Iterator[None]:
    """Set SQL confs of ``spark`` for the block, then put back what was there (or unset)."""
    previous = {key: spark.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def spark_error(exc: BaseException) -> str:
    """What Spark said, on one line: a Py4J error's first line only names the JVM call
    ("An error occurred while calling o42.executeCompaction."), so its Java exception is used.

    Example::

        except Exception as exc:
            log.warning("compaction failed: %s", spark_error(exc))
    """
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    return next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
