"""The coordinator's topics get their configs when created and when found with others (real broker)."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from coordinator.client.topics import COMPACTED, TIMED, Topics, ensure_topics
from coordinator.settings import Settings

pytestmark = pytest.mark.integration


def topic_config(admin: AdminClient, name: str, keys: list[str]) -> dict[str, str]:
    [future] = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)]).values()
    entries = future.result(timeout=30)
    return {key: entries[key].value for key in keys}


def test_topics_made_by_an_older_lockstep_get_todays_compaction_settings(settings: Settings) -> None:
    topics = Topics(f"cfg{uuid.uuid4().hex[:8]}")
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    older = {"cleanup.policy": "compact", "segment.ms": "3600000", "delete.retention.ms": "86400000"}
    admin.create_topics([NewTopic(topics.barriers, 1, 1, config=older)])[topics.barriers].result(timeout=30)

    created = ensure_topics(dataclasses.replace(settings, topic_prefix=topics.prefix), topics)

    assert topics.barriers not in created and set(created) == set(topics.configs()) - {topics.barriers}
    for name in topics.state:
        assert topic_config(admin, name, list(COMPACTED)) == COMPACTED, name
    assert topic_config(admin, topics.commands, list(TIMED)) == TIMED
    assert ensure_topics(dataclasses.replace(settings, topic_prefix=topics.prefix), topics) == []  # idempotent
