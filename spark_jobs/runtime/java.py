"""JVM classes by their full names, each resolved once per process.

Py4J resolves ``spark._jvm.org.apache.hadoop.fs.Path`` one name at a time: it asks the JVM for
"org", then "org.apache", ... as a class first, and each of those is a ``Class.forName`` that
fails only after searching every jar of the driver's classpath. A job touched the JVM that way
many times a barrier (each file it read, each look at a Delta log), and with ten tables those
failed searches were a sixth of the jobs' CPU (docs/performance.md). Named whole here (Py4J's
``JavaClass``), a constructor or a static method is one round trip.

Example::

    Path = java_class(spark, "org.apache.hadoop.fs.Path")
    path = Path("/w/t")                                         # a constructor: one round trip
    log = static(spark, "org.apache.spark.sql.delta.DeltaLog", "forTable")(spark._jsparkSession, "/w/t")
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from py4j.java_gateway import JavaClass, JavaMember
from py4j.protocol import STATIC_PREFIX
from pyspark.sql import SparkSession

_lock = threading.Lock()
# (gateway client's id, class, member or "") -> (the client, its JavaClass / JavaMember); the
# client is held so that its id names no later session's client
_resolved: dict[tuple[int, str, str], tuple[Any, Any]] = {}


def java_class(spark: SparkSession, name: str) -> Any:
    """The JVM class ``name`` (``a.b.C``, a nested one ``a.b.C$D``): call it to construct one."""
    return _resolve(spark, name, "", lambda client: JavaClass(name, client))


def static(spark: SparkSession, name: str, method: str) -> Any:
    """The static method ``method`` of the JVM class ``name`` (a Scala object's method too:
    its class's static forwarder), ready to call."""
    return _resolve(spark, name, method, lambda client: JavaMember(method, None, STATIC_PREFIX + name, client))


def _resolve(spark: SparkSession, name: str, member: str, make: Callable[[Any], Any]) -> Any:
    """``make(client)`` for ``spark``'s gateway client, once per client, class and member."""
    client = spark._jvm._gateway_client  # type: ignore[union-attr]
    key = (id(client), name, member)
    with _lock:
        if key not in _resolved:
            _resolved[key] = (client, make(client))
        return _resolved[key][1]


def none(spark: SparkSession) -> Any:
    """Scala's ``None``."""
    return static(spark, "scala.Option", "empty")()


def some(spark: SparkSession, value: Any) -> Any:
    """Scala's ``Option(value)``."""
    return static(spark, "scala.Option", "apply")(value)
