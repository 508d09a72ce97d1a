"""Lockstep's topics, their configs, and creating them.

State topics are compacted (the latest value per entity key rebuilds everything);
commands and outcomes are requests and answers, kept for a time only.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # exported, not in __all__

from coordinator.settings import Settings

COMPACTED = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": "60000",  # readers that just started see recent history uncompacted
    "delete.retention.ms": "86400000",  # tombstones live a day: long enough for any replay to see them
    "segment.ms": "3600000",
}
TIMED = {"cleanup.policy": "delete", "retention.ms": str(7 * 86400000)}


@dataclass(frozen=True)
class Topics:
    """Topic names under one prefix (``LOCKSTEP_TOPIC_PREFIX``, default ``lockstep``)."""

    prefix: str = "lockstep"

    @property
    def commands(self) -> str:
        return f"{self.prefix}.commands"

    @property
    def outcomes(self) -> str:
        return f"{self.prefix}.outcomes"

    @property
    def registry(self) -> str:
        return f"{self.prefix}.registry"

    @property
    def leases(self) -> str:
        return f"{self.prefix}.leases"

    @property
    def barriers(self) -> str:
        return f"{self.prefix}.barriers"

    @property
    def completions(self) -> str:
        return f"{self.prefix}.completions"

    @property
    def state(self) -> tuple[str, ...]:
        """The compacted topics whose fold is the coordinator's state."""
        return (self.registry, self.leases, self.barriers, self.completions)

    def configs(self) -> dict[str, dict[str, str]]:
        return {
            **{name: COMPACTED for name in self.state},
            self.commands: TIMED,
            self.outcomes: TIMED,
        }


def ensure_topics(settings: Settings, topics: Topics) -> list[str]:
    """Create missing Lockstep topics (one partition each: one ordered log per topic)."""
    admin = AdminClient(settings.kafka_config())
    existing = set(admin.list_topics(timeout=10).topics)
    wanted = [
        NewTopic(name, 1, settings.replication_factor, config=config)
        for name, config in topics.configs().items()
        if name not in existing
    ]
    if not wanted:
        return []
    created = []
    for name, future in admin.create_topics(wanted).items():
        try:
            future.result(timeout=30)
            created.append(name)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):  # another worker won the race
                raise
    return sorted(created)
