"""Lockstep's topics, their configs, and creating them.

State topics are compacted (the latest value per entity key rebuilds everything);
commands and outcomes are requests and answers, kept for a time only.

A state topic holds what the coordinator still needs (the leader tombstones what falls below
the retention floor) plus what Kafka has not compacted away yet: the records of the segment
being written (a segment is compacted only after it rolls) and the tombstones, which stay
``delete.retention.ms`` after compaction. Short segments and a short tombstone life keep that
to a few minutes of writes, so replaying the state costs the same after a week as after a
few minutes. A tombstone only has to outlive the readers that are behind it: every Lockstep
reader folds from the beginning in about a second and then follows the head.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # exported, not in __all__
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from coordinator.domain.roles import Role
from coordinator.settings import Settings

log = logging.getLogger(__name__)

# Errors a CreateTopics request meets while a fresh client learns the cluster or a controller is
# elected: librdkafka retires its bootstrap connections once it knows the brokers, failing what
# was in flight on them with _DESTROY_BROKER
PASSING = frozenset({
    KafkaError._DESTROY_BROKER, KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NOT_CONTROLLER, KafkaError._ALL_BROKERS_DOWN,
})

COMPACTED = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": "60000",  # readers that just started see recent history uncompacted
    "delete.retention.ms": "120000",  # tombstones outlive any replay (~1 s) and follower by far
    "segment.ms": "120000",  # a segment becomes compactable after 2 minutes
    "min.cleanable.dirty.ratio": "0.2",  # compact once a fifth of the topic is dirty (Kafka: half)
}
TIMED = {"cleanup.policy": "delete", "retention.ms": str(7 * 86400000)}
# consumer group ids, after the prefix: state readers (+ a random id), command clients, Spark's
# Kafka source, `lockstep tail`, the demo. Each assigns its partitions itself, so sharing a group
# with another process takes nothing from it; the worker's own is ``P-coordinator`` (Faust's).
STATE_GROUP, COMMANDS_GROUP, SPARK_GROUP, TAIL_GROUP, DEMO_GROUP = "-state-", "-cli", "-spark", "-tail", "-demo"


@dataclass(frozen=True)
class Topics:
    """Topic names under one prefix (``LOCKSTEP_TOPIC_PREFIX``, default ``lockstep``)."""

    prefix: str = "lockstep"

    @property
    def commands(self) -> str:
        """Where clients of a Lockstep without roles sent commands: still read, every one refused
        (``Coordinator.handle_command`` says to upgrade the client)."""
        return f"{self.prefix}.commands"

    def commands_of(self, role: Role) -> str:
        """The command topic of ``role``: only its principals may write it (``lockstep acls``)."""
        return f"{self.prefix}.commands.{role}"

    @property
    def command_topics(self) -> dict[str, Role | None]:
        """Every topic the coordinator takes commands from, with the role it speaks for."""
        return {**{self.commands_of(role): role for role in Role}, self.commands: None}

    def state_kind(self, topic: str) -> str:
        """A state topic's short name (``registry``, ...), what ``roles.STATE_KINDS`` is keyed by."""
        return topic.removeprefix(f"{self.prefix}.")

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

    def configs(self, replication_factor: int = 1) -> dict[str, dict[str, str]]:
        """Each topic's config; replicated topics take a write only once two replicas have it
        (``min.insync.replicas`` 2 from 3 replicas on), so a broker that dies loses nothing."""
        durable = {"min.insync.replicas": str(min(2, max(1, replication_factor - 1)))}
        return {
            **{name: COMPACTED | durable for name in self.state},
            **{name: TIMED | durable for name in self.command_topics},
            self.outcomes: TIMED | durable,
        }


def ensure_topics(settings: Settings, topics: Topics) -> list[str]:
    """Create missing Lockstep topics (one partition each: one ordered log per topic) and give
    existing ones the configs above (topics made by an older Lockstep keep their records)."""
    admin = AdminClient(settings.kafka_config())
    existing = set(admin.list_topics(timeout=10).topics)
    configs = topics.configs(settings.replication_factor)
    align_configs(admin, {name: config for name, config in configs.items() if name in existing})
    wanted = [
        NewTopic(name, 1, settings.replication_factor, config=config)
        for name, config in configs.items()
        if name not in existing
    ]
    return create_topics(admin, wanted)


def _passing(exc: BaseException) -> bool:
    return isinstance(exc, KafkaException) and (exc.args[0].code() in PASSING or exc.args[0].retriable())


def create_topics(admin: AdminClient, wanted: Iterable[NewTopic], timeout: float = 30.0) -> list[str]:
    """Create ``wanted``, asking again for up to ``timeout`` seconds while an error passes (see
    ``PASSING``); returns the topics this call created, sorted. A topic that exists already is
    no error (another client won the race, or an earlier attempt of this one did).

    Example::

        create_topics(AdminClient({"bootstrap.servers": "127.0.0.1:9092"}), [NewTopic("orders", 2, 1)])
    """
    remaining = {topic.topic: topic for topic in wanted}
    created: list[str] = []

    def attempt() -> None:
        failures: list[KafkaException] = []
        for name, future in admin.create_topics(list(remaining.values()), request_timeout=timeout).items():
            try:
                future.result(timeout=timeout)
                created.append(name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    failures.append(exc)
                    continue
            del remaining[name]
        if failures:
            raise next((f for f in failures if not _passing(f)), failures[0])

    if remaining:
        for retry in Retrying(retry=retry_if_exception(_passing), stop=stop_after_delay(timeout),
                              wait=wait_exponential(multiplier=0.2, max=2), reraise=True):
            with retry:
                attempt()
    return sorted(created)


def align_configs(admin: AdminClient, configs: dict[str, dict[str, str]]) -> list[str]:
    """Set on each existing topic the entries of its config that differ; returns the topics
    changed. A principal that may not describe or alter configs gets a warning, not an error:
    the topics still work, their state just takes longer to compact."""
    if not configs:
        return []
    try:
        described = {resource.name: future.result(timeout=30) for resource, future in
                     admin.describe_configs([ConfigResource(ResourceType.TOPIC, name) for name in configs]).items()}
        changes = [
            ConfigResource(ResourceType.TOPIC, name, incremental_configs=[
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
                for key, value in wanted.items() if key not in described[name] or described[name][key].value != value])
            for name, wanted in configs.items()
        ]
        changes = [change for change in changes if change.incremental_configs]
        for future in admin.incremental_alter_configs(changes).values() if changes else ():
            future.result(timeout=30)
    except KafkaException as exc:
        log.warning("could not align the configs of %s (%s); grant ALTER_CONFIGS on them or run "
                    "`lockstep acls coordinator PRINCIPAL --apply`", ", ".join(sorted(configs)), exc.args[0])
        return []
    return sorted(change.name for change in changes)
