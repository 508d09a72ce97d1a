"""Talk to a running coordinator: send a command and wait for its outcome; GET the REST API.

Example::

    outcome = emit(settings, DeclareTable(new_request_id(), "shopping", "root"))
    print(outcome.accepted, outcome.reason)
    state = get_json(settings, "/state")
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from coordinator.codec import DecodeError, default_codec
from coordinator.domain import Command, CommandOutcome
from coordinator.settings import Settings
from coordinator.stream.topics import Topics


class Unreachable(RuntimeError):
    """The broker or the coordinator did not answer; the message names what and where."""


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex[:16]}"


def emit(settings: Settings, command: Command, timeout: float = 30.0) -> CommandOutcome:
    """Produce ``command`` and wait for the coordinator's outcome for its request id."""
    topics = Topics(settings.topic_prefix)
    codec = default_codec()
    consumer = Consumer(settings.kafka_config(**{"group.id": "lockstep-cli", "enable.auto.commit": False, "log_level": 3}))
    try:
        try:
            _, high = consumer.get_watermark_offsets(TopicPartition(topics.outcomes, 0), timeout=10)
        except KafkaException as exc:
            raise Unreachable(
                f"cannot read {topics.outcomes} on {settings.bootstrap} ({exc}); is the broker up "
                "(lockstep dev up) and the coordinator started once (lockstep worker)?"
            ) from exc
        consumer.assign([TopicPartition(topics.outcomes, 0, high)])
        producer = Producer(settings.kafka_config(**{"log_level": 3}))
        producer.produce(topics.commands, key=command.request_id.encode(), value=codec.encode(command))
        if producer.flush(10) != 0:
            raise Unreachable(f"could not deliver the command to {topics.commands} on {settings.bootstrap}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None or msg.key() != command.request_id.encode():
                continue
            try:
                outcome = codec.decode(msg.value())
            except DecodeError:
                continue
            if isinstance(outcome, CommandOutcome):
                return outcome
        raise Unreachable(
            f"no outcome for request {command.request_id} within {timeout:.0f}s: is the coordinator "
            f"running (lockstep worker) against {settings.bootstrap}?"
        )
    finally:
        consumer.close()


def get_json(settings: Settings, path: str, timeout: float = 10.0) -> Any:
    """GET ``path`` from the coordinator's REST API; 4xx bodies with an error are returned as-is."""
    url = settings.coordinator_url.rstrip("/") + path
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if 400 <= exc.code < 500:
            return json.loads(exc.read())
        raise Unreachable(f"coordinator at {url} answered HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise Unreachable(
            f"coordinator not reachable at {url} ({exc}); start it with `lockstep worker` "
            "or set LOCKSTEP_COORDINATOR_URL"
        ) from exc
