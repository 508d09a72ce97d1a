"""The Hive metastore's database of the local stack: Derby's network server on 127.0.0.1, run
from the jars ``scripts/setup`` cached, so every Spark process (jobs, readers, ``lockstep``
commands) shares one catalog of table names. An embedded Derby, Spark's default, admits one
process at a time. ``lockstep dev up --metastore`` and the catalog tests use this class.

Example::

    meta = LocalMetastore(home=Path(".lockstep/metastore"), jars=Path(".lockstep/jars/derby"), port=1527)
    meta.up()          # returns once the server accepts connections
    meta.url           # 'jdbc:derby://127.0.0.1:1527/metastore': the LOCKSTEP_METASTORE to set
    meta.down()
"""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlparse

from coordinator.settings import Settings
from lockstep.dev.service import HOST, LocalService, ServiceError

MAIN_CLASS = "org.apache.derby.drda.NetworkServerControl"
DEFAULT_PORT = 1527
DATABASE = "metastore"


class MetastoreError(ServiceError):
    """The local metastore database could not be started or stopped; the message says why."""


class LocalMetastore(LocalService):
    """Owns one Derby network server: its databases, log and pid file under ``home``."""

    name = "metastore"
    main_class = MAIN_CLASS
    error = MetastoreError
    port_setting = f"LOCKSTEP_METASTORE=jdbc:derby://{HOST}:<port>/{DATABASE}"

    def __init__(self, home: Path, jars: Path, port: int = DEFAULT_PORT, heap: str = "256m") -> None:
        super().__init__(home, port)
        self.jars = Path(jars).absolute()
        self.heap = heap

    @classmethod
    def for_settings(cls, settings: Settings) -> LocalMetastore | None:
        """The server ``lockstep dev`` manages: ``$LOCKSTEP_HOME/metastore`` on the port of a
        ``jdbc:derby://127.0.0.1:PORT/...`` LOCKSTEP_METASTORE (1527 if unset); None if the
        metastore is elsewhere or a metastore service."""
        if settings.metastore and not settings.metastore.startswith(f"jdbc:derby://{HOST}:"):
            return None
        port = urlparse(settings.metastore.removeprefix("jdbc:")).port if settings.metastore else None
        return cls(settings.home / "metastore", settings.jars / "derby", port or DEFAULT_PORT)

    @property
    def url(self) -> str:
        """The ``LOCKSTEP_METASTORE`` that makes Lockstep's Spark sessions use this server."""
        return f"jdbc:derby://{HOST}:{self.port}/{DATABASE}"

    def up(self, timeout: float = 60.0) -> int:
        """Start the server unless ours already runs; returns its pid once it accepts connections."""
        return self.start(timeout)

    def prepare(self) -> None:
        self.require_jars(self.jars, "derbynet-*.jar", "Derby network server")

    def command(self) -> list[str]:
        java = self.java(self.jars, self.heap, "start", "-h", HOST, "-p", str(self.port), "-noSecurityManager")
        return [java[0], f"-Dderby.system.home={self.home}", *java[1:]]

    def answers(self) -> bool:
        try:
            socket.create_connection((HOST, self.port), timeout=1).close()
        except OSError as exc:
            self.last_error = str(exc)
            return False
        return True
