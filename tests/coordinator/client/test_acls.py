"""The roles' ACLs as data (a secured broker checks them for real: tests/drills/test_security.py)."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from coordinator.client.acls import ROLES, bindings, grants
from coordinator.client.topics import Topics
from coordinator.domain.errors import UsageError

TOPICS = Topics("acme")


def writable(role: str) -> set[str]:
    """Topics a role may write (a prefixed grant stands for the whole prefix)."""
    return {g.name + ("*" if g.prefixed else "") for g in grants(role, TOPICS, ["orders"])
            if g.resource == ResourceType.TOPIC and AclOperation.WRITE in g.operations}


def readable(role: str) -> set[str]:
    return {g.name + ("*" if g.prefixed else "") for g in grants(role, TOPICS, ["orders"])
            if g.resource == ResourceType.TOPIC and AclOperation.READ in g.operations}


def test_only_the_coordinator_writes_its_state_and_others_write_the_command_topics_of_their_role() -> None:
    assert writable("coordinator") == {"acme*"}
    assert writable("operator") == {"acme.commands.operator", "acme.commands.job", "acme.commands.reader"}
    assert writable("job") == {"acme.commands.job", "acme.commands.reader", "acme.completions"}
    assert writable("reader") == {"acme.commands.reader"}


def test_only_the_coordinator_and_operators_read_the_command_topics_where_lease_secrets_travel() -> None:
    state = {"acme.registry", "acme.leases", "acme.barriers", "acme.completions", "acme.outcomes"}
    assert readable("reader") == state
    assert readable("job") == state | {"orders"}
    assert readable("operator") == readable("coordinator") == {"acme*"}


def test_the_leader_transactional_id_and_data_topics_go_where_they_are_used() -> None:
    coordinator = grants("coordinator", TOPICS, ["orders"])
    assert any(g.resource == ResourceType.TRANSACTIONAL_ID and g.name == "acme-coordinator-leader" for g in coordinator)
    assert [g.operations for g in coordinator if g.name == "orders"] == [(AclOperation.DESCRIBE,)]
    assert [g.operations for g in grants("job", TOPICS, ["orders"]) if g.name == "orders"] == \
        [(AclOperation.READ, AclOperation.DESCRIBE)]
    assert not [g for g in grants("reader", TOPICS, ["orders"]) if g.name == "orders"]


@pytest.mark.parametrize("role", ROLES)
def test_each_role_reads_only_its_own_clients_groups_and_only_the_coordinator_the_workers(role: str) -> None:
    groups = {g.name for g in grants(role, TOPICS) if g.resource == ResourceType.GROUP and g.prefixed}
    worker = "acme-coordinator"  # Faust's group: its members are assigned the command partitions
    assert any(worker.startswith(g) for g in groups) == (role == "coordinator")
    assert all(any(used.startswith(g) for g in groups) for used in {
        "reader": ["acme-state-1f", "acme-cli"], "job": ["acme-state-1f", "acme-cli", "acme-spark-kafka-source-x"],
        "operator": ["acme-state-1f", "acme-cli", "acme-tail", "acme-demo-sizes"],
        "coordinator": ["acme-state-1f", "acme-coordinator"]}[role])


def test_bindings_allow_one_operation_each_for_the_principal() -> None:
    made = bindings("User:etl", grants("reader", TOPICS))
    assert len(made) == sum(len(g.operations) for g in grants("reader", TOPICS))
    assert {(b.principal, b.host) for b in made} == {("User:etl", "*")}
    assert {b.resource_pattern_type for b in made} == {ResourcePatternType.PREFIXED, ResourcePatternType.LITERAL}


def test_an_unknown_role_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="use one of reader, job, operator, coordinator"):
        grants("admin", TOPICS)
