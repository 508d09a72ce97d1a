"""The Kafka ACLs each Lockstep principal needs on a cluster that authorises (and granting them).

Three roles, so that only the coordinator can write what the coordinator's state is made of:

* ``coordinator`` (``lockstep worker``): creates, reads and writes the topics under the prefix
  (registry, barriers, leases, outcomes; tombstones on completions) and keeps their configs
  (``coordinator.client.topics``), joins its consumer group,
  writes through its transactional id (the fenced leader), and describes the data topics to
  cut barriers at their end offsets.
* ``job`` (``lockstep run``, the Spark jobs): reads the topics under the prefix and the data
  topics, writes commands (register, renew, stop) and completions.
* ``reader`` (``open_snapshot``, the CLI): reads the topics under the prefix and writes
  commands (leases, revisions, drops; the coordinator decides them).

A principal with none of these cannot write a command or forge a state record.

Example::

    grant(admin_settings, "User:jobs", "job", data_topics=["shopping_source"])
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka.admin import (  # type: ignore[attr-defined]  # exported, not in __all__
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from coordinator.client.topics import Topics
from coordinator.domain.errors import UsageError
from coordinator.settings import Settings

ROLES = ("coordinator", "job", "reader")


@dataclass(frozen=True)
class Grant:
    """Operations allowed on one resource (``prefixed``: every name that starts with ``name``)."""

    resource: ResourceType
    name: str
    prefixed: bool
    operations: tuple[AclOperation, ...]


def grants(role: str, topics: Topics, data_topics: Iterable[str] = ()) -> list[Grant]:
    """What ``role`` needs under ``topics.prefix`` (group and Spark group ids start with it too)."""
    if role not in ROLES:
        raise UsageError(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
    read = (AclOperation.READ, AclOperation.DESCRIBE)
    prefix = topics.prefix
    common = [Grant(ResourceType.GROUP, prefix, True, (AclOperation.READ, AclOperation.DESCRIBE))]
    if role == "coordinator":
        return [
            *common,
            Grant(ResourceType.TOPIC, prefix, True, (*read, AclOperation.WRITE, AclOperation.CREATE,
                                                     AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS)),
            Grant(ResourceType.TRANSACTIONAL_ID, f"{prefix}-coordinator-leader", False,
                  (AclOperation.WRITE, AclOperation.DESCRIBE)),
            *(Grant(ResourceType.TOPIC, t, False, (AclOperation.DESCRIBE,)) for t in data_topics),
        ]
    writes = [topics.commands, topics.completions] if role == "job" else [topics.commands]
    return [
        *common,
        Grant(ResourceType.TOPIC, prefix, True, read),
        *(Grant(ResourceType.TOPIC, t, False, (AclOperation.WRITE,)) for t in writes),
        *(Grant(ResourceType.TOPIC, t, False, read) for t in (data_topics if role == "job" else ())),
    ]


def bindings(principal: str, role_grants: Iterable[Grant]) -> list[AclBinding]:
    """One ALLOW binding per operation, from any host."""
    return [
        AclBinding(g.resource, g.name, ResourcePatternType.PREFIXED if g.prefixed else ResourcePatternType.LITERAL,
                   principal, "*", operation, AclPermissionType.ALLOW)
        for g in role_grants for operation in g.operations
    ]


def grant(settings: Settings, principal: str, role: str, data_topics: Iterable[str] = ()) -> list[AclBinding]:
    """Create the ACLs of ``role`` for ``principal`` as the principal of ``settings`` (an admin)."""
    created = bindings(principal, grants(role, Topics(settings.topic_prefix), data_topics))
    admin = AdminClient(settings.kafka_config())
    for future in admin.create_acls(created).values():
        future.result(timeout=30)
    return created
