"""One typed settings object, read from ``LOCKSTEP_*`` environment variables.

Every process (CLI, worker, Spark jobs, tests) builds its configuration here so that a
variable means the same thing everywhere.

Example::

    >>> s = Settings.from_env({"LOCKSTEP_BOOTSTRAP": "127.0.0.1:19092"})
    >>> s.bootstrap_host, s.bootstrap_port
    ('127.0.0.1', 19092)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.domain.errors import UsageError

KAFKA_PASSTHROUGH_PREFIX = "LOCKSTEP_KAFKA_"


class SettingsError(UsageError, ValueError):
    """A ``LOCKSTEP_*`` variable has a value that cannot be used."""


@dataclass(frozen=True)
class Settings:
    """Where things are and how to reach them."""

    bootstrap: str = "127.0.0.1:9092"
    home: Path = Path(".lockstep")
    warehouse: Path = Path(".lockstep/warehouse")
    jars: Path = Path(".lockstep/jars")
    coordinator_url: str = "http://127.0.0.1:6066"
    topic_prefix: str = "lockstep"
    replication_factor: int = 1
    kafka_client: Mapping[str, str] = field(default_factory=dict)
    retain_barriers: int = 100  # vacuum keeps the exact points of this many newest barriers

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the environment (``os.environ`` by default); relative paths stay relative to cwd."""
        env = os.environ if env is None else env
        home = Path(env.get("LOCKSTEP_HOME", ".lockstep"))
        settings = cls(
            bootstrap=env.get("LOCKSTEP_BOOTSTRAP", "127.0.0.1:9092"),
            home=home,
            warehouse=Path(env.get("LOCKSTEP_WAREHOUSE", str(home / "warehouse"))),
            jars=Path(env.get("LOCKSTEP_JARS", str(home / "jars"))),
            coordinator_url=env.get("LOCKSTEP_COORDINATOR_URL", "http://127.0.0.1:6066"),
            topic_prefix=env.get("LOCKSTEP_TOPIC_PREFIX", "lockstep"),
            replication_factor=_whole_number(env, "LOCKSTEP_REPLICATION_FACTOR", 1),
            kafka_client=kafka_passthrough(env),
            retain_barriers=_whole_number(env, "LOCKSTEP_RETAIN_BARRIERS", 100, minimum=0),
        )
        _ = settings.bootstrap_port  # validate early, with a message that names the variable
        return settings

    @property
    def bootstrap_host(self) -> str:
        return self.bootstrap.split(",")[0].rsplit(":", 1)[0]

    @property
    def bootstrap_port(self) -> int:
        first = self.bootstrap.split(",")[0]
        host, sep, port = first.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise SettingsError(
                f"LOCKSTEP_BOOTSTRAP={self.bootstrap!r} is not host:port; "
                "set it like LOCKSTEP_BOOTSTRAP=127.0.0.1:9092"
            )
        return int(port)

    def kafka_config(self, **extra: str | int | bool) -> dict[str, str | int | bool]:
        """confluent-kafka client config: bootstrap + ``LOCKSTEP_KAFKA_*`` pass-through + extra."""
        return {"bootstrap.servers": self.bootstrap, **self.kafka_client, **extra}


def _whole_number(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = env.get(name, str(default))
    if not raw.isdigit() or int(raw) < minimum:
        raise SettingsError(f"{name}={raw!r} must be a whole number >= {minimum}")
    return int(raw)


def kafka_passthrough(env: Mapping[str, str]) -> dict[str, str]:
    """``LOCKSTEP_KAFKA_SASL_MECHANISM=PLAIN`` becomes ``{"sasl.mechanism": "PLAIN"}``."""
    return {
        key[len(KAFKA_PASSTHROUGH_PREFIX):].lower().replace("_", "."): value
        for key, value in env.items()
        if key.startswith(KAFKA_PASSTHROUGH_PREFIX)
    }
