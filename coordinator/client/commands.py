"""Send a command to the coordinator and wait for its outcome (over Kafka).

Example::

    outcome = emit(settings, DeclareTable(new_request_id(), "shopping", "root"))
    print(outcome.accepted, outcome.reason)
"""

from __future__ import annotations

import threading
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from coordinator.client.topics import COMMANDS_GROUP, Topics
from coordinator.codec import DecodeError, default_codec
from coordinator.domain import Command, CommandOutcome
from coordinator.domain.errors import LockstepError, NotAuthorised, Unreachable
from coordinator.domain.roles import DEFAULT_ROLES, Role
from coordinator.settings import Settings


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex[:16]}"


class CommandClient:
    """Sends commands and waits for their outcomes over one producer and one outcomes consumer,
    so a process that sends many (a repeatable-read lease per snapshot) connects once.
    Thread-safe: one command at a time.

    Example::

        client = CommandClient(settings)
        client.emit(AcquireLease(new_request_id(), "l1", "me", ("t",), 7, 30_000))
        client.close()
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.codec = default_codec(settings.schemas)
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None

    def _connect(self) -> tuple[Consumer, Producer]:
        if self._consumer is None or self._producer is None:
            consumer = Consumer(self.settings.kafka_config({"group.id": self.settings.topic_prefix + COMMANDS_GROUP,
                                                            "enable.auto.commit": False, "log_level": 3},
                                                           client="lockstep-outcomes"))
            try:
                # a topic the principal may not describe looks missing to a watermark query; its
                # metadata says why
                described = consumer.list_topics(self.topics.outcomes, timeout=10).topics.get(self.topics.outcomes)
                if described is not None and described.error is not None \
                        and described.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    consumer.close()
                    raise refused(self.settings, f"read {self.topics.outcomes}")
                _, high = consumer.get_watermark_offsets(TopicPartition(self.topics.outcomes, 0), timeout=10)
            except KafkaException as exc:
                consumer.close()
                raise Unreachable(
                    f"cannot read {self.topics.outcomes} on {self.settings.bootstrap} ({exc}); is the broker up "
                    "(lockstep dev up) and the coordinator started once (lockstep worker)?"
                ) from exc
            consumer.assign([TopicPartition(self.topics.outcomes, 0, high)])
            producer = Producer(self.settings.kafka_config({"log_level": 3}, client="lockstep-commands"))
            self._consumer, self._producer = consumer, producer
        return self._consumer, self._producer

    def emit(self, command: Command, timeout: float = 30.0, role: Role | None = None) -> CommandOutcome:
        """Produce ``command`` to the command topic of ``role`` (default: the command's usual
        sender, ``roles.DEFAULT_ROLES``) and wait for the coordinator's outcome for its request id."""
        topic = self.topics.commands_of(role or DEFAULT_ROLES[type(command).__name__])
        with self._lock:
            consumer, producer = self._connect()
            failed: list[KafkaError] = []
            producer.produce(topic, key=command.request_id.encode(), value=self.codec.encode(command),
                             on_delivery=lambda error, _: failed.append(error) if error is not None else None)
            if producer.flush(10) != 0 or failed:
                raise undelivered(self.settings, topic, failed[0] if failed else None)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                value = None if msg is None or msg.error() is not None else msg.value()
                if value is None or msg is None or msg.key() != command.request_id.encode():
                    continue  # nothing yet, or another client's outcome
                try:
                    outcome = self.codec.decode(value)
                except DecodeError:
                    continue
                if isinstance(outcome, CommandOutcome):
                    return outcome
            raise Unreachable(
                f"no outcome for request {command.request_id} within {timeout:.0f}s: is the coordinator "
                f"running (lockstep worker) against {self.settings.bootstrap}?"
            )

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
            self._consumer = self._producer = None


def refused(settings: Settings, what: str) -> NotAuthorised:
    principal = settings.kafka_security.username or "ANONYMOUS"
    return NotAuthorised(f"the broker does not let User:{principal} {what}; grant it the ACLs of its role "
                         "(`lockstep acls`, docs/security.md)")


def undelivered(settings: Settings, topic: str, error: KafkaError | None) -> LockstepError:
    """Why a record to ``topic`` was not delivered, as the error a person can act on."""
    if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return refused(settings, f"write {topic}")
    return Unreachable(f"could not deliver to {topic} on {settings.bootstrap}" + (f": {error.str()}" if error else ""))


def emit(settings: Settings, command: Command, timeout: float = 30.0, role: Role | None = None) -> CommandOutcome:
    """Send one command as ``role`` and wait for its outcome (a fresh connection; see CommandClient)."""
    client = CommandClient(settings)
    try:
        return client.emit(command, timeout, role)
    finally:
        client.close()
