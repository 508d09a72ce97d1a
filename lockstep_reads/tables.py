"""Delta tables at a version, opened with delta-rs (the ``deltalake`` package: no JVM).

Versions never change once committed, so an opened version is kept and shared by every later
read of it (``TableVersions``); a reader that moves forward one barrier at a time opens each
version once. Before a version is read, its protocol is checked against the reader features
this path is tested with: a table that needs another one is refused with an error that names
the feature, never read into wrong rows.

Example::

    versions = TableVersions(settings)
    table = versions.open("/data/wh/orders", 42)    # a deltalake.DeltaTable at version 42
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from coordinator.client.snapshots import SnapshotError
from coordinator.settings import Settings

# Reader features (Delta protocol) whose tables this path reads as Spark does: each is in the
# fixture matrix of tests/lockstep_reads/test_tables.py, checked row for row against Spark.
READABLE_FEATURES = frozenset({"deletionVectors", "columnMapping", "timestampNtz", "v2Checkpoint",
                               "vacuumProtocolCheck"})
KEPT_VERSIONS = 256  # opened versions kept for later reads (a few kB of log state each)


class UnreadableTable(SnapshotError):
    """A table needs a Delta feature this path cannot read; the message names it and the way out."""


class VersionGone(SnapshotError):
    """The version a read pinned was vacuumed, or its log expired."""


def delta_uri(location: str) -> str:
    """The URI delta-rs opens for a location as Spark's Hadoop names it (``s3a://`` is ``s3://``).

    >>> delta_uri("s3a://lake/wh/orders"), delta_uri("/data/wh/orders")
    ('s3://lake/wh/orders', '/data/wh/orders')
    """
    return "s3://" + location[len("s3a://"):] if location.startswith("s3a://") else location


def storage_options(settings: Settings) -> dict[str, str]:
    """How delta-rs reaches an object store: ``LOCKSTEP_S3_*``, as Spark's s3a does (without
    keys, credentials come from the usual ``AWS_*`` variables).

    >>> from coordinator.settings import S3Access
    >>> storage_options(Settings(s3=S3Access("http://127.0.0.1:9000", "k", "s")))["AWS_ALLOW_HTTP"]
    'true'
    """
    endpoint = settings.s3.endpoint
    options: dict[str, str] = {}
    if endpoint:
        options |= {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1",
                    "AWS_ALLOW_HTTP": str(endpoint.startswith("http:")).lower(),
                    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"}
    if settings.s3.access_key and settings.s3.secret_key:
        options |= {"AWS_ACCESS_KEY_ID": settings.s3.access_key, "AWS_SECRET_ACCESS_KEY": settings.s3.secret_key}
    return options


def check_readable(name: str, table: DeltaTable) -> None:
    """Raise ``UnreadableTable`` if ``table`` needs a reader feature outside ``READABLE_FEATURES``."""
    protocol = table.protocol()
    needed = set(protocol.reader_features or ())
    if protocol.min_reader_version == 2:
        needed.add("columnMapping")  # reader version 2 is column mapping, without a feature list
    elif protocol.min_reader_version > 3:
        needed.add(f"reader version {protocol.min_reader_version}")
    unknown = sorted(needed - READABLE_FEATURES)
    if unknown:
        raise UnreadableTable(
            f"table {name!r} uses the Delta feature(s) {', '.join(unknown)}, which this reader (delta-rs) is not "
            "checked to read as Spark does; read it through Spark (lockstep query --engine spark, or "
            "open_snapshot(..., spark=spark))")


class TableVersions:
    """Opened table versions, kept and shared (thread-safe); see the module."""

    def __init__(self, settings: Settings, kept: int = KEPT_VERSIONS) -> None:
        self.settings = settings
        self.kept = kept
        self._open: OrderedDict[tuple[str, int | None], DeltaTable] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, location: str, version: int | None, name: str | None = None) -> DeltaTable:
        """The table at ``location`` at ``version`` (None: its newest now, never kept).
        Raises ``VersionGone``, ``UnreadableTable`` or ``SnapshotError`` (no table there)."""
        name = name or location.rstrip("/").rsplit("/", 1)[-1]
        key = (location, version)
        with self._lock:
            if version is not None and key in self._open:
                self._open.move_to_end(key)
                return self._open[key]
        options = storage_options(self.settings) or None
        try:
            table = DeltaTable(delta_uri(location), version=version, storage_options=options)
        except DeltaError as exc:
            if version is not None and (gone(exc) or self._exists(location, options)):
                raise VersionGone(f"table {name!r} version {version} is no longer available: it was vacuumed or its "
                                  f"log expired ({first_line(exc)})") from exc
            if isinstance(exc, TableNotFoundError):
                raise SnapshotError(f"table {name!r} has no Delta table at {location} (yet): {first_line(exc)}") from exc
            raise SnapshotError(f"cannot open table {name!r} at {location}: {first_line(exc)}") from exc
        check_readable(name, table)
        if version is not None:
            with self._lock:
                self._open[key] = table
                while len(self._open) > self.kept:
                    self._open.popitem(last=False)
        return table


    @staticmethod
    def _exists(location: str, options: dict[str, str] | None) -> bool:
        """Whether a Delta table is at ``location`` at all (some version of it opens)."""
        try:
            DeltaTable(delta_uri(location), storage_options=options)
        except DeltaError:
            return False
        return True


def gone(error: BaseException) -> bool:
    """Whether delta-rs failed because a version's log or files are no longer there.

    >>> gone(Exception("Object at location /wh/t/part-0.parquet not found: No such file or directory"))
    True
    >>> gone(Exception("Error during planning: table 'datafusion.public.t' not found"))
    False
    """
    text = str(error).lower()
    return "no such file" in text or "object at location" in text or "not the same as the specified end version" in text


def first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
