"""A barrier's append or whole rewrite of a table, committed without rebuilding the table's state.

Delta's writer (4.4) checks a write's txn mark (``txnAppId``/``txnVersion``) in the table's full
state: ``snapshot.transactions`` replays the last checkpoint and every commit since in a Spark
job, and since every commit makes a new snapshot, every barrier of every table paid that replay
again (a rewrite's list of the files it replaces too). Yet the checksum Delta writes beside each
commit (``<version>.crc``) already holds the marks of up to 100 apps and, for a table of up to
50 files, its file list, carried forward from the checksum before without any replay.

``commit_directly`` reads the mark there; if the barrier is not in the table yet and the frame
has the table's columns, it commits the barrier itself, as Delta's writer would: a
transaction on the table's newest snapshot, ``writeFiles``, and one commit of the new files
(and, for a rewrite, the removal of every file the checksum lists) with the mark and the same
``WRITE`` operation and metadata. Another writer that committed meanwhile makes the commit
conflict (the app id is registered as read; a rewrite reads the whole table), as Delta's own
writer would. Where the checksum lacks the marks or the file list, or the write needs more
(a new table, another schema), it returns a ``Fallback`` saying why, and the caller writes the
usual way.

Example::

    from spark_jobs.runtime.delta_log import delta_log
    done = commit_directly(spark, delta_log(spark, path), frame, "append", Mark("job#g0", 17, '{"barrier": 17}'))
    if isinstance(done, Fallback):
        frame.write.format("delta").mode("append").save(path)   # under the txn session confs
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from spark_jobs.runtime.java import java_class, none, some, static

DELTA = "org.apache.spark.sql.delta."
ALREADY = -1  # ``commit_directly``'s answer for a barrier the table holds already (its mark says so)


class Mark(NamedTuple):
    """A barrier's txn mark and the metadata its commit carries."""

    app_id: str
    version: int  # the barrier
    metadata: str  # the commit's userMetadata (JSON)


@dataclass(frozen=True)
class Fallback:
    """Why a barrier went Delta's usual way (said once per table and reason)."""

    reason: str


def commit_directly(spark: SparkSession, log: Any, frame: DataFrame, mode: str, mark: Mark,
                    options: Mapping[str, str] | None = None,
                    before_commit: Callable[[], None] | None = None) -> int | Fallback:
    """Commit ``frame`` to the table of ``log`` (``delta_log.delta_log``) as ``mark``'s barrier: appended
    (``mode`` "append") or replacing every row ("overwrite"). Returns the version made,
    ``ALREADY`` if the table's mark holds the barrier, or a ``Fallback`` saying why the usual
    writer must do it. ``before_commit`` runs between writing the files and committing them
    (drills crash there)."""
    snapshot = log.update(False, none(spark), none(spark))
    if snapshot.version() < 0:
        return Fallback("the table has no commit yet")
    checksum = snapshot.checksumOpt()
    if not checksum.isDefined():
        return Fallback("its newest version has no checksum (written by another writer, or checksums off)")
    marks = checksum.get().setTransactions()
    if not marks.isDefined():
        return Fallback("its checksum keeps no txn marks (over 100 apps wrote the table, or a txn retention is set)")
    found = max((t.version() for t in _items(spark, marks.get()) if t.appId() == mark.app_id), default=-1)
    if found >= mark.version:
        return ALREADY
    schema = StructType.fromJson(json.loads(snapshot.metadata().schemaString()))
    if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in frame.schema.fields]:
        return Fallback("the frame's columns are not the table's")
    replaced: list[Any] = []
    if mode == "overwrite":
        listed = checksum.get().allFiles()
        if not listed.isDefined():
            return Fallback("its checksum lists no files (over 50)")
        replaced = _items(spark, listed.get())
    txn = log.startTransaction(none(spark), some(spark, snapshot))
    txn.readTxn().addOne(mark.app_id)  # a concurrent commit of this app conflicts, as with txnVersion
    if mode == "overwrite":
        txn.readWholeTable()  # a concurrent append conflicts
    written_options = java_class(spark, DELTA + "DeltaOptions")(_scala_map(spark, options or {}),
                                                               spark._jsparkSession.sessionState().conf())
    written = txn.writeFiles(frame._jdf, some(spark, written_options))
    if before_commit is not None:
        before_commit()
    now = int(time.time() * 1000)
    actions = [*_items(spark, written), *(f.removeWithTimestamp(now, True) for f in replaced)]
    txn.updateSetTransaction(mark.app_id, mark.version, some(spark, static(spark, "java.lang.Long", "valueOf")(now)))
    save_mode = static(spark, "org.apache.spark.sql.SaveMode", "valueOf")("Overwrite" if mode == "overwrite" else "Append")
    operation = java_class(spark, DELTA + "DeltaOperations$Write")(
        save_mode, some(spark, _scala_list(spark, [])), none(spark), some(spark, mark.metadata),
        none(spark), none(spark), none(spark), none(spark), none(spark))
    return int(txn.commit(_scala_list(spark, actions), operation))


def _items(spark: SparkSession, seq: Any) -> list[Any]:
    """A Scala collection's elements, fetched by index: iterating it to its end would raise and
    catch an exception in the JVM, which PySpark's error conversion then inspects with many
    class lookups (``java``)."""
    items = static(spark, "scala.jdk.javaapi.CollectionConverters", "asJava")(seq)
    return [items.get(i) for i in range(items.size())]


def _scala_list(spark: SparkSession, items: Iterable[Any]) -> Any:
    """An immutable Scala list of ``items`` (JVM objects or strings)."""
    java = java_class(spark, "java.util.ArrayList")()
    for item in items:
        java.add(item)
    return static(spark, "org.apache.spark.api.python.PythonUtils", "toList")(java)


def _scala_map(spark: SparkSession, entries: Mapping[str, str]) -> Any:
    """An immutable Scala map of ``entries``."""
    java = java_class(spark, "java.util.HashMap")()
    for key, value in entries.items():
        java.put(key, value)
    return static(spark, "org.apache.spark.api.python.PythonUtils", "toScalaMap")(java)
