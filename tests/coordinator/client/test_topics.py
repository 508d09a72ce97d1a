"""The coordinator's topics get their configs when created and when found with others (real broker);
creating topics rides out the errors a fresh client meets (a stand-in admin client: pure retry logic)."""

from __future__ import annotations

import dataclasses
import uuid
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed

from coordinator.client.topics import COMPACTED, TIMED, Topics, create_topics, ensure_topics
from coordinator.settings import Settings
from tests.support import wait_until

pytestmark = pytest.mark.integration


def _not_known_yet(error: BaseException) -> bool:
    return isinstance(error, KafkaException) and error.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def topic_config(admin: AdminClient, name: str, keys: list[str]) -> dict[str, str]:
    """A topic's configs; a topic created a moment ago may not be in the answering broker's
    metadata yet (a loaded machine), so the question is asked again for up to 30 s."""
    for attempt in Retrying(retry=retry_if_exception(_not_known_yet), stop=stop_after_delay(30), wait=wait_fixed(0.2),
                            reraise=True):
        with attempt:
            [future] = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)]).values()
            entries = future.result(timeout=30)
    return {key: entries[key].value for key in keys}


def test_topics_made_by_an_older_lockstep_get_todays_compaction_settings(settings: Settings) -> None:
    topics = Topics(f"cfg{uuid.uuid4().hex[:8]}")
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    older = {"cleanup.policy": "compact", "segment.ms": "3600000", "delete.retention.ms": "86400000"}
    create_topics(admin, [NewTopic(topics.barriers, 1, 1, config=older)])

    created = ensure_topics(dataclasses.replace(settings, topic_prefix=topics.prefix), topics)

    assert topics.barriers not in created and set(created) == set(topics.configs()) - {topics.barriers}
    for name in topics.state:
        assert topic_config(admin, name, list(COMPACTED)) == COMPACTED, name
    assert topic_config(admin, topics.commands, list(TIMED)) == TIMED
    assert ensure_topics(dataclasses.replace(settings, topic_prefix=topics.prefix), topics) == []  # idempotent


def test_creating_topics_returns_those_it_created_and_takes_existing_ones_as_done(settings: Settings) -> None:
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    names = [f"made_{uuid.uuid4().hex[:8]}" for _ in range(2)]

    assert create_topics(admin, [NewTopic(name, 1, 1) for name in names]) == sorted(names)
    assert create_topics(admin, [NewTopic(name, 1, 1) for name in names]) == []
    # a created topic reaches the broker's metadata a moment after the controller's answer (a loaded machine)
    wait_until(lambda: set(names) <= set(admin.list_topics(timeout=10).topics), "the new topics listed", timeout=30)
    for future in admin.delete_topics(names).values():
        future.result(timeout=30)


class FailingFirst:
    """An admin client whose first CreateTopics fails ``failing`` with ``code`` (what librdkafka
    answers when it retires the bootstrap connection a request was in flight on)."""

    def __init__(self, code: int, failing: set[str]) -> None:
        self.code, self.failing = code, failing
        self.calls: list[list[str]] = []

    def create_topics(self, topics: list[NewTopic], **_: Any) -> dict[str, Future[None]]:
        self.calls.append([topic.topic for topic in topics])
        futures = {}
        for topic in topics:
            future: Future[None] = Future()
            if len(self.calls) == 1 and topic.topic in self.failing:
                future.set_exception(KafkaException(KafkaError(self.code)))
            elif len(self.calls) > 1 and topic.topic not in self.failing:
                future.set_exception(KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS)))
            else:
                future.set_result(None)
            futures[topic.topic] = future
        return futures


def test_a_request_failed_by_a_retired_connection_is_asked_again_for_the_topics_it_missed() -> None:
    admin = FailingFirst(KafkaError._DESTROY_BROKER, {"b"})

    assert create_topics(admin, [NewTopic("a", 1, 1), NewTopic("b", 1, 1)], timeout=5) == ["a", "b"]  # type: ignore[arg-type]
    assert admin.calls == [["a", "b"], ["b"]]


def test_an_error_that_does_not_pass_is_raised_at_once() -> None:
    admin = FailingFirst(KafkaError.INVALID_REPLICATION_FACTOR, {"a"})

    with pytest.raises(KafkaException, match="INVALID_REPLICATION_FACTOR"):
        create_topics(admin, [NewTopic("a", 1, 3)], timeout=5)  # type: ignore[arg-type]
    assert admin.calls == [["a"]]
