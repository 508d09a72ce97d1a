"""The Spark driver JVM's options, with a class data archive (CDS) when one was made.

A job process that starts again after a crash spends its first seconds loading and linking
some 25,000 classes of Spark, Delta and Scala. A dynamic CDS archive (JDK 13+) holds them
already parsed and verified: measured on a 2-core machine, a cold session, Delta write, MERGE
and read took 11.7 s with it against 15.6 s without (``bench.restart`` times whole restarts).
``scripts/setup`` makes the archive once (``spark_jobs.runtime.warmup``); every session built by
``session.build_session`` then maps it. An archive that does not fit the JVM or its class path
(another Java, a reinstalled pyspark, an extra driver class path) is ignored by the JVM, silently.

Example::

    options = driver_java_options(settings)   # "-Xss32m -XX:SharedArchiveFile=... -Xlog:cds=off ..."
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
BASE_OPTIONS = "-Xss32m"
# an archive the JVM cannot use is no error: it runs without, and says nothing
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"


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


def driver_java_options(settings: Settings) -> str:
    """``spark.driver.extraJavaOptions``: the base options, the class archive if there is one, and
    ``LOCKSTEP_DRIVER_JVM_OPTIONS``."""
    archive = archive_path(settings)
    options = [BASE_OPTIONS]
    if archive.is_file():
        options.append(f"-XX:SharedArchiveFile={archive.absolute()} {QUIET_CDS}")
    if settings.driver_jvm_options:  # LOCKSTEP_DRIVER_JVM_OPTIONS
        options.append(settings.driver_jvm_options)
    return " ".join(options)
