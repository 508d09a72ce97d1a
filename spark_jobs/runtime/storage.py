"""The warehouse's files through Hadoop's FileSystem API, the one Spark and Delta use: the
same calls for a local folder, ``s3a://``, ``hdfs://`` or ``abfss://``, so nothing in Lockstep
lists, reads or deletes table files with local file calls (which would miss an object store).

Example::

    store = Storage(spark)
    if store.exists(settings.table_location("orders")):
        store.delete(settings.table_location("orders"))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

from spark_jobs.runtime.java import java_class, static

TEXT_PIECE = 2000  # characters of a file's text per Py4J answer: at most 6 KB of UTF-8, under its 8 KB buffer


@dataclass(frozen=True)
class FileInfo:
    """One file: its full URI (``file:/...``, ``s3a://...``), size and modification time."""

    uri: str
    size: int
    modified_ms: int


class Storage:
    """File operations on any Hadoop file system Spark is configured for."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._conf = spark._jsc.hadoopConfiguration()  # type: ignore[union-attr]

    def _fs(self, location: str) -> tuple[Any, Any]:
        path = java_class(self.spark, "org.apache.hadoop.fs.Path")(location)
        return path.getFileSystem(self._conf), path

    def qualified(self, location: str) -> str:
        """``location`` as the file system names it (``/w/t`` becomes ``file:/w/t``)."""
        fs, path = self._fs(location)
        return str(fs.makeQualified(path).toString())

    def exists(self, location: str) -> bool:
        fs, path = self._fs(location)
        return bool(fs.exists(path))

    def is_dir(self, location: str) -> bool:
        """Whether ``location`` is a folder (an object store: a prefix with objects under it)."""
        fs, path = self._fs(location)
        return bool(fs.exists(path) and fs.getFileStatus(path).isDirectory())

    def delete(self, location: str) -> bool:
        """Delete a file or a folder with everything in it; False if there was nothing."""
        fs, path = self._fs(location)
        return bool(fs.delete(path, True))

    def rename(self, source: str, target: str) -> bool:
        """Rename a file or folder (at once on a disk or HDFS; an object store copies); False if it failed."""
        fs, path = self._fs(source)
        return bool(fs.rename(path, self._fs(target)[1]))

    def make_folder(self, location: str) -> None:
        """Make the folder ``location`` and those above it (an object store: nothing to make)."""
        fs, path = self._fs(location)
        fs.mkdirs(path)

    def copy(self, source: str, target: str) -> None:
        """Copy the file ``source`` to ``target`` (through this process: for small files)."""
        fs, path = self._fs(source)
        target_fs, target_path = self._fs(target)
        if not static(self.spark, "org.apache.hadoop.fs.FileUtil", "copy")(fs, path, target_fs, target_path, False, self._conf):
            raise OSError(f"could not copy {source} to {target}")

    def files(self, location: str, suffix: str = "") -> list[FileInfo]:
        """Every file under ``location`` (recursively) whose name ends with ``suffix``; [] if
        there is no such folder. A file that vanishes while it is listed (a running job's
        temporary file, renamed into place) fails the listing on a local disk (Hadoop asks each
        file's permissions as it goes): the listing is then taken again, up to 3 times."""
        fs, path = self._fs(location)
        for attempt in Retrying(retry=retry_if_exception_type(Py4JJavaError), stop=stop_after_attempt(3), reraise=True):
            with attempt:
                if not fs.exists(path):
                    return []
                out = []
                found = fs.listFiles(path, True)
                while found.hasNext():
                    status = found.next()
                    uri = str(status.getPath().toString())
                    if uri.endswith(suffix):
                        out.append(FileInfo(uri, int(status.getLen()), int(status.getModificationTime())))
        return out

    def names(self, location: str) -> list[str]:
        """Names of the entries directly in the folder ``location`` ([] if it does not exist)."""
        fs, path = self._fs(location)
        if not fs.exists(path):
            return []
        return sorted(str(status.getPath().getName()) for status in fs.listStatus(path))

    def read_text(self, location: str) -> str | None:
        """A small file's content as UTF-8 text; None if it does not exist. It crosses from the
        JVM in pieces of ``TEXT_PIECE`` characters: a Py4J answer longer than its 8 KB write
        buffer goes out in two writes, and Nagle's algorithm holds the second until Python's
        delayed ACK of the first, ~40 ms later (py4j issue 516). A 13 KB checksum file took 48 ms
        read whole and 4 ms in pieces."""
        fs, path = self._fs(location)
        if not fs.exists(path):
            return None
        text = java_class(self.spark, "java.lang.StringBuilder")()
        reader = java_class(self.spark, "java.io.InputStreamReader")(fs.open(path), "UTF-8")
        try:
            static(self.spark, "org.apache.commons.io.IOUtils", "copy")(reader, text)
        finally:
            reader.close()
        size = text.length()
        return "".join(text.substring(i, min(i + TEXT_PIECE, size)) for i in range(0, size, TEXT_PIECE))
