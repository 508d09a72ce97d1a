"""The Kafka ACLs each Lockstep principal needs on a cluster that authorises (and granting them).

Four roles (``coordinator.domain.roles``), so that only the coordinator writes what the
coordinator's state is made of, and each other role writes only the command topics of the
roles it includes; what it may do with a command is decided by the coordinator:

* ``coordinator`` (``lockstep worker``): creates, reads and writes the topics under the prefix
  (registry, barriers, leases, outcomes; tombstones on completions) and keeps their configs
  (``coordinator.client.topics``), joins its consumer group,
  writes through its transactional id (the fenced leader), and describes the data topics to
  cut barriers at their end offsets.
* ``operator`` (``lockstep stop``, ``revise``, ``drop``): reads every topic under the prefix and
  writes the operator's, job's and reader's command topics.
* ``job`` (``lockstep run``, the Spark jobs): reads the state topics, the outcomes and the data
  topics, writes the job's and reader's command topics and completions.
* ``reader`` (``open_snapshot``, ``lockstep query``, ``lockstep serve``): reads the state topics and
  the outcomes, writes the reader's command topic (leases). It cannot read the command topics,
  where the lease secrets of other readers travel.

A principal with none of these cannot write a command or forge a state record. Each role
reads only the consumer groups its own clients use (``GROUPS``); the worker's Faust group
(``P-coordinator``), which is assigned the command partitions, is the coordinator's alone, so no
other principal can join it and take those partitions from the worker.

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

from coordinator.client.topics import COMMANDS_GROUP, DEMO_GROUP, SPARK_GROUP, STATE_GROUP, TAIL_GROUP, Topics
from coordinator.domain.errors import UsageError
from coordinator.domain.roles import Role
from coordinator.settings import Settings

ROLES = tuple(role.value for role in Role)
INCLUDES = {Role.READER: (Role.READER,), Role.JOB: (Role.JOB, Role.READER),
            Role.OPERATOR: (Role.OPERATOR, Role.JOB, Role.READER)}  # whose command topics a role writes
# the consumer groups (``P`` + suffix, prefixed) each role's clients use
GROUPS = {Role.READER: (STATE_GROUP, COMMANDS_GROUP), Role.JOB: (STATE_GROUP, COMMANDS_GROUP, SPARK_GROUP),
          Role.OPERATOR: (STATE_GROUP, COMMANDS_GROUP, TAIL_GROUP, DEMO_GROUP)}


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
    if role == Role.COORDINATOR:
        return [
            Grant(ResourceType.GROUP, prefix, True, read),
            Grant(ResourceType.TOPIC, prefix, True, (*read, AclOperation.WRITE, AclOperation.CREATE,
                                                     AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS)),
            Grant(ResourceType.TRANSACTIONAL_ID, f"{prefix}-coordinator-leader", False,
                  (AclOperation.WRITE, AclOperation.DESCRIBE)),
            *(Grant(ResourceType.TOPIC, t, False, (AclOperation.DESCRIBE,)) for t in data_topics),
        ]
    reads = ([Grant(ResourceType.TOPIC, prefix, True, read)] if role == Role.OPERATOR else
             [Grant(ResourceType.TOPIC, t, False, read) for t in (*topics.state, topics.outcomes)])
    writes = [topics.commands_of(r) for r in INCLUDES[Role(role)]] + ([topics.completions] if role == Role.JOB else [])
    return [
        *(Grant(ResourceType.GROUP, prefix + suffix, True, read) for suffix in GROUPS[Role(role)]),
        *reads,
        *(Grant(ResourceType.TOPIC, t, False, (AclOperation.WRITE,)) for t in writes),
        *(Grant(ResourceType.TOPIC, t, False, read) for t in (data_topics if role == Role.JOB else ())),
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
