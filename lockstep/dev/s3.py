"""An S3-API server on 127.0.0.1 for an ``s3a://`` warehouse on one machine: s3proxy with its
filesystem backend (objects are files under ``home/data/<bucket>/``), run from the jars
``scripts/setup`` cached. ``lockstep dev up --s3`` and the S3 tests use this class, so the
tests talk to the server a developer gets.

Example::

    s3 = LocalS3(home=Path(".lockstep/s3"), jars=Path(".lockstep/jars/s3proxy"), port=9000)
    s3.up()            # creates the bucket folders, returns once the server answers HTTP
    s3.env()           # LOCKSTEP_S3_ENDPOINT / _ACCESS_KEY / _SECRET_KEY for Lockstep processes
    s3.down()
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

from coordinator.settings import Settings
from lockstep.dev.service import HOST, LocalService, ServiceError

MAIN_CLASS = "org.gaul.s3proxy.Main"
DEFAULT_PORT = 9000
DEFAULT_BUCKET = "lockstep"
# The local server's account (it listens on loopback only, and its bucket folders are readable
# without one, as jclouds' filesystem backend makes them).
ACCESS_KEY, SECRET_KEY = "lockstep", "lockstep-local-secret"


class S3Error(ServiceError):
    """The local S3 server could not be started or stopped; the message says why and what to do."""


class LocalS3(LocalService):
    """Owns one s3proxy's folder: properties, objects, log and pid file under ``home``."""

    name = "s3"
    main_class = MAIN_CLASS
    error = S3Error
    port_setting = f"LOCKSTEP_S3_ENDPOINT=http://{HOST}:<port>"

    def __init__(self, home: Path, jars: Path, port: int = DEFAULT_PORT, buckets: Sequence[str] = (DEFAULT_BUCKET,),
                 heap: str = "256m") -> None:
        super().__init__(home, port)
        self.jars = Path(jars).absolute()
        self.buckets = tuple(buckets)
        self.heap = heap

    @classmethod
    def for_settings(cls, settings: Settings) -> LocalS3 | None:
        """The server ``lockstep dev`` manages: ``$LOCKSTEP_HOME/s3`` on LOCKSTEP_S3_ENDPOINT's port
        (9000 if unset), with the bucket of an ``s3a://`` LOCKSTEP_WAREHOUSE; None if
        LOCKSTEP_S3_ENDPOINT is not on loopback."""
        endpoint = urlparse(settings.s3.endpoint or f"http://{HOST}:{DEFAULT_PORT}")
        if endpoint.hostname not in (HOST, "localhost"):
            return None
        bucket = urlparse(settings.warehouse).netloc if settings.warehouse.startswith("s3a://") else DEFAULT_BUCKET
        return cls(settings.home / "s3", settings.jars / "s3proxy", endpoint.port or DEFAULT_PORT, (bucket,))

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def properties_file(self) -> Path:
        return self.home / "s3proxy.properties"

    @property
    def marker(self) -> str:
        return str(self.properties_file)

    def env(self) -> dict[str, str]:
        """``LOCKSTEP_S3_*`` variables that make a Lockstep process a client of this server."""
        return {"LOCKSTEP_S3_ENDPOINT": self.endpoint, "LOCKSTEP_S3_ACCESS_KEY": ACCESS_KEY,
                "LOCKSTEP_S3_SECRET_KEY": SECRET_KEY}

    def up(self, timeout: float = 60.0) -> int:
        """Start the server unless ours already runs; returns its pid once it answers HTTP."""
        return self.start(timeout)

    def prepare(self) -> None:
        self.require_jars(self.jars, "s3proxy-*.jar", "s3proxy")
        for bucket in self.buckets:  # the filesystem backend's bucket is a folder
            (self.home / "data" / bucket).mkdir(parents=True, exist_ok=True)
        self.properties_file.write_text("\n".join([
            f"s3proxy.endpoint={self.endpoint}",
            "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={ACCESS_KEY}",
            f"s3proxy.credential={SECRET_KEY}",
            "jclouds.provider=filesystem",
            f"jclouds.filesystem.basedir={self.home / 'data'}",
            "",
        ]))

    def command(self) -> list[str]:
        return self.java(self.jars, self.heap, "--properties", str(self.properties_file))

    def answers(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint + "/", timeout=1).close()
        except urllib.error.HTTPError:
            return True  # an S3 error answer (access denied to an anonymous request) is an answer
        except OSError as exc:
            self.last_error = str(exc)
            return False
        return True
