"""The schema registry of the local change-data-capture stack: Apicurio Registry 2.6 (in-memory
storage) on 127.0.0.1, from the archive ``scripts/setup`` unpacked. Its Confluent-compatible
API (``/apis/ccompat/v7``) is what ``LOCKSTEP_SCHEMA_REGISTRY_URL`` points at; Kafka Connect's
converter registers schemas through its own API (``/apis/registry/v2``). Schemas live in memory:
they are gone when the registry stops, as the topics framed with their ids usually are too in a
local stack (stop both with ``lockstep dev down``).

Example::

    registry = LocalRegistry(home=Path(".lockstep/registry"), jars=Path(".lockstep/jars/registry"), port=8081)
    registry.up()        # returns once the API answers
    registry.url         # 'http://127.0.0.1:8081/apis/ccompat/v7': the LOCKSTEP_SCHEMA_REGISTRY_URL to set
    registry.down()
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from coordinator.settings import Settings
from lockstep.dev.service import HOST, LocalService, ServiceError

DEFAULT_PORT = 8081
COMPAT_PATH = "/apis/ccompat/v7"
NATIVE_PATH = "/apis/registry/v2"


class RegistryError(ServiceError):
    """The local schema registry could not be started or stopped; the message says why."""


class LocalRegistry(LocalService):
    """Owns one Apicurio Registry process: its log and pid file under ``home``."""

    name = "registry"
    error = RegistryError
    port_setting = f"LOCKSTEP_SCHEMA_REGISTRY_URL=http://{HOST}:<port>{COMPAT_PATH}"

    def __init__(self, home: Path, jars: Path, port: int = DEFAULT_PORT, heap: str = "384m") -> None:
        super().__init__(home, port)
        self.jars = Path(jars).absolute()
        self.heap = heap
        runners = sorted(self.jars.glob("app/*-runner.jar"))
        self.main_class = str(runners[-1] if runners else self.jars / "app" / "apicurio-registry-app-runner.jar")

    @classmethod
    def for_settings(cls, settings: Settings) -> LocalRegistry | None:
        """The registry ``lockstep dev`` manages: ``$LOCKSTEP_HOME/registry`` on the port of
        LOCKSTEP_SCHEMA_REGISTRY_URL (8081 if unset); None if that URL is not on loopback."""
        url = urlparse(settings.schema_registry_url or f"http://{HOST}:{DEFAULT_PORT}{COMPAT_PATH}")
        if url.hostname not in (HOST, "localhost"):
            return None
        return cls(settings.home / "registry", settings.jars / "registry", url.port or DEFAULT_PORT)

    @property
    def url(self) -> str:
        """The Confluent-compatible API: the ``LOCKSTEP_SCHEMA_REGISTRY_URL`` to set."""
        return f"http://{HOST}:{self.port}{COMPAT_PATH}"

    @property
    def native_url(self) -> str:
        """Apicurio's own API, which its Kafka Connect converter talks to."""
        return f"http://{HOST}:{self.port}{NATIVE_PATH}"

    def prepare(self) -> None:
        if not Path(self.main_class).exists():
            raise RegistryError(f"no Apicurio Registry under {self.jars / 'app'}. Run scripts/setup from the "
                                "repository root, or point LOCKSTEP_JARS at the folder that holds registry/.")

    def command(self) -> list[str]:
        return ["java", f"-Xmx{self.heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dquarkus.http.host={HOST}", f"-Dquarkus.http.port={self.port}", f"-Dlockstep.home={self.home}",
                "-jar", self.main_class]

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError) as exc:
            self.last_error = str(exc)
            return False

    def up(self, timeout: float = 60.0) -> int:
        """Start the registry unless ours already runs; returns its pid once it answers."""
        return self.start(timeout)
