"""One typed settings object, read from ``LOCKSTEP_*`` environment variables.

Every process (CLI, worker, Spark jobs, tests) builds its configuration here, once, and passes
it on, so that a variable means the same thing everywhere; nothing else reads ``LOCKSTEP_*``.
A bad value is a ``SettingsError`` naming the variable and what it must look like.

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
from urllib.parse import urlparse

from coordinator.domain.barriers import BarrierConfig
from coordinator.domain.errors import UsageError

KAFKA_PASSTHROUGH_PREFIX = "LOCKSTEP_KAFKA_"
KafkaValue = str | int | float | bool  # what a confluent-kafka config value may be
CRASH_POINTS = ("before_commit", "before_completion", "pause_before_announce")
SPARK_LOG_LEVELS = ("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF", "TRACE")


class SettingsError(UsageError, ValueError):
    """A ``LOCKSTEP_*`` variable has a value that cannot be used."""


@dataclass(frozen=True)
class CrashAt:
    """Drills only (``LOCKSTEP_CRASH_AT=before_commit:0.3``): a process stops itself at ``point``
    with probability ``chance`` (``coordinator.faults``)."""

    point: str
    chance: float = 1.0


@dataclass(frozen=True)
class Settings:
    """Where things are, how to reach them, and the knobs of barriers, Spark and drills."""

    bootstrap: str = "127.0.0.1:9092"
    home: Path = Path(".lockstep")
    warehouse: Path = Path(".lockstep/warehouse")
    jars: Path = Path(".lockstep/jars")
    coordinator_url: str = "http://127.0.0.1:6066"
    topic_prefix: str = "lockstep"
    replication_factor: int = 1
    kafka_client: Mapping[str, str] = field(default_factory=dict)
    retain_barriers: int = 100  # vacuum keeps the exact points of this many newest barriers
    barriers: BarrierConfig = BarrierConfig()  # spacing, backpressure, liveness, catch-up stride
    schemas: Path | None = None  # the Avro schemas; None: schemas/ of this checkout
    spark_master: str = "local[2]"
    spark_log_level: str | None = None  # None: WARN (the demo's live view asks for ERROR)
    crash_at: CrashAt | None = None
    compact_every: int = 100  # a job compacts its table's small files after every this many commits (0: never)
    vacuum_every_s: int = 600  # `lockstep run` vacuums its jobs' tables this often (0: never)
    log_retention_hours: int = 24  # Delta log entries older than this (rounded down to midnight) go at a checkpoint

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
            barriers=BarrierConfig(
                interval_ms=_whole_number(env, "LOCKSTEP_BARRIER_INTERVAL_MS", BarrierConfig.interval_ms),
                max_inflight=_whole_number(env, "LOCKSTEP_BARRIER_MAX_INFLIGHT", BarrierConfig.max_inflight),
                liveness_ms=_whole_number(env, "LOCKSTEP_JOB_LIVENESS_MS", BarrierConfig.liveness_ms),
                catchup_stride=_whole_number(env, "LOCKSTEP_BARRIER_CATCHUP_STRIDE", BarrierConfig.catchup_stride),
            ),
            schemas=Path(env["LOCKSTEP_SCHEMAS"]) if env.get("LOCKSTEP_SCHEMAS") else None,
            spark_master=env.get("LOCKSTEP_SPARK_MASTER") or "local[2]",
            spark_log_level=_spark_log_level(env.get("LOCKSTEP_SPARK_LOG_LEVEL")),
            crash_at=_crash_at(env.get("LOCKSTEP_CRASH_AT")),
            compact_every=_whole_number(env, "LOCKSTEP_COMPACT_EVERY", 100, minimum=0),
            vacuum_every_s=_whole_number(env, "LOCKSTEP_VACUUM_EVERY_S", 600, minimum=0),
            log_retention_hours=_whole_number(env, "LOCKSTEP_LOG_RETENTION_HOURS", 24),
        )
        _ = settings.bootstrap_port  # validate early, with a message that names the variable
        _ = settings.coordinator_port
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

    @property
    def coordinator_host(self) -> str:
        return urlparse(self.coordinator_url).hostname or "127.0.0.1"

    @property
    def coordinator_port(self) -> int:
        url = urlparse(self.coordinator_url)
        try:
            port = url.port
        except ValueError:
            port = None
        if url.scheme not in ("http", "https") or not url.hostname or (port is None and url.netloc.count(":")):
            raise SettingsError(f"LOCKSTEP_COORDINATOR_URL={self.coordinator_url!r} is not http://host[:port]; "
                                "set it like LOCKSTEP_COORDINATOR_URL=http://127.0.0.1:6066")
        return port or 6066

    def kafka_config(self, extra: Mapping[str, KafkaValue] | None = None) -> dict[str, KafkaValue]:
        """confluent-kafka client config: bootstrap + ``LOCKSTEP_KAFKA_*`` pass-through + extra."""
        return {"bootstrap.servers": self.bootstrap, **self.kafka_client, **(extra or {})}


def _whole_number(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = env.get(name, str(default))
    if not raw.isdigit() or int(raw) < minimum:
        raise SettingsError(f"{name}={raw!r} must be a whole number >= {minimum}")
    return int(raw)


def _spark_log_level(raw: str | None) -> str | None:
    if not raw:
        return None
    if raw.upper() not in SPARK_LOG_LEVELS:
        raise SettingsError(f"LOCKSTEP_SPARK_LOG_LEVEL={raw!r} is not a Spark log level; "
                            f"use one of {', '.join(SPARK_LOG_LEVELS)}")
    return raw.upper()


def _crash_at(raw: str | None) -> CrashAt | None:
    """``before_commit`` or ``before_commit:0.3`` (point, probability)."""
    if not raw:
        return None
    point, _, chance = raw.partition(":")
    try:
        probability = float(chance or 1)
    except ValueError:
        probability = -1.0
    if point not in CRASH_POINTS or not 0 <= probability <= 1:
        raise SettingsError(f"LOCKSTEP_CRASH_AT={raw!r} must be POINT[:PROBABILITY] with POINT one of "
                            f"{', '.join(CRASH_POINTS)} and PROBABILITY between 0 and 1")
    return CrashAt(point, probability)


def kafka_passthrough(env: Mapping[str, str]) -> dict[str, str]:
    """``LOCKSTEP_KAFKA_SASL_MECHANISM=PLAIN`` becomes ``{"sasl.mechanism": "PLAIN"}``."""
    return {
        key[len(KAFKA_PASSTHROUGH_PREFIX):].lower().replace("_", "."): value
        for key, value in env.items()
        if key.startswith(KAFKA_PASSTHROUGH_PREFIX)
    }
