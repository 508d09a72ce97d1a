"""Synthetic records produced to Kafka at a steady rate, each stamped with its produce time.

``lockstep datagen shopping`` makes FLIP-276's purchases: every item has a fixed unit price and
a purchase of ``amount`` pieces costs exactly ``amount * unit_price(item)``, so in any
consistent snapshot of ``user_item_amount`` and ``user_item_price`` the average price
``total_price / total_amount`` of every (user, item) is the unit price. Unit prices are
multiples of 0.25, so the sums are exact in floating point.

Every record carries ``ts``, the epoch milliseconds at which it was handed to the producer:
a table that keeps ``MAX(ts)`` tells a reader how fresh the data it sees is.

``send_lines`` sends records a user wrote (JSON Lines), for trying one's own pipeline.

Example::

    gen = RateGenerator(settings, "shopping_source", rate=2000, make=purchases(users=100, items=20))
    gen.run(stop_event, seconds=10, progress=print)   # then gen.sent == ~20000
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from coordinator.client.topics import create_topics
from coordinator.domain.errors import LockstepError, Unreachable, UsageError
from coordinator.settings import Settings

# (random source, produce time in epoch ms) -> (record key, record), or (record key, record,
# topic) for a maker of several topics' records (spark_jobs.demo.nexmark)
RecordMaker = Callable[[random.Random, int], tuple[str, dict[str, Any]] | tuple[str, dict[str, Any], str]]


def unit_price(item_id: int) -> float:
    """The fixed price of one piece of ``item_id``.

    >>> unit_price(0), unit_price(5)
    (1.0, 2.25)
    """
    return 0.25 * (4 + item_id % 37)


def purchases(users: int = 100, items: int = 20) -> RecordMaker:
    """FLIP-276 purchases ``{user_id, item_id, amount, price, ts}``, keyed by user.

    >>> key, record = purchases(3, 5)(random.Random(1), 1700000000000)
    >>> sorted(record), record["price"] == record["amount"] * unit_price(record["item_id"]), record["ts"]
    (['amount', 'item_id', 'price', 'ts', 'user_id'], True, 1700000000000)
    """
    if users < 1 or items < 1:
        raise ValueError("users and items must be at least 1")

    def make(rng: random.Random, ts: int) -> tuple[str, dict[str, int | float]]:
        user, item, amount = rng.randrange(users), rng.randrange(items), rng.randrange(1, 6)
        return str(user), {"user_id": user, "item_id": item, "amount": amount, "price": amount * unit_price(item), "ts": ts}

    return make


def ensure_topic(settings: Settings, topic: str, partitions: int) -> bool:
    """Create ``topic`` if it does not exist; True if this call created it."""
    admin = AdminClient(settings.kafka_config({"log_level": 0}))  # (its failure is the message below)
    try:
        if topic in admin.list_topics(timeout=10).topics:
            return False
    except KafkaException as exc:
        raise Unreachable(f"cannot list the topics on {settings.bootstrap} ({exc}); is the broker up "
                          "(lockstep dev up, or LOCKSTEP_BOOTSTRAP)?") from exc
    return bool(create_topics(admin, [NewTopic(topic, partitions, settings.replication_factor)]))


def parse_lines(lines: Iterable[str], key_field: str | None = None) -> list[tuple[str | None, bytes]]:
    """Each non-blank line as (record key, record value): a line must be one JSON object, holding
    ``key_field`` when one is named (its value, as text, is the key). A bad line raises UsageError
    naming it, before anything is sent.

    >>> parse_lines(['{"user": "ann", "n": 1}', "", '{"user": 7}'], key_field="user")
    [('ann', b'{"user": "ann", "n": 1}'), ('7', b'{"user": 7}')]
    >>> parse_lines(['{"user": "ann"}', '[1]'])
    Traceback (most recent call last):
    ...
    coordinator.domain.errors.UsageError: line 2 is a JSON list, not an object; write one JSON object per line
    """
    records: list[tuple[str | None, bytes]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"line {number} is not JSON ({exc}); write one JSON object per line") from None
        if not isinstance(record, dict):
            raise UsageError(f"line {number} is a JSON {type(record).__name__}, not an object; write one JSON object per line")
        if key_field is not None and key_field not in record:
            raise UsageError(f"line {number} has no field {key_field!r} for the record key; add it or leave out --key")
        key = None if key_field is None else (v if isinstance(v := record[key_field], str) else json.dumps(v))
        records.append((key, line.strip().encode()))
    return records


def send_lines(settings: Settings, topic: str, records: list[tuple[str | None, bytes]], partitions: int) -> int:
    """Send ``records`` (``parse_lines``) to ``topic``, creating it with ``partitions`` if new;
    return how many Kafka acknowledged. Raises LockstepError if some were not delivered."""
    ensure_topic(settings, topic, partitions)
    producer = Producer({**settings.kafka_config(), "enable.idempotence": True})
    failed: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(str(error))

    for key, value in records:
        producer.produce(topic, value=value, key=key, on_delivery=delivered)
        producer.poll(0)
    if producer.flush(30):
        raise LockstepError(f"{topic}: {len(producer)} records were not delivered within 30 s; is the broker up?")
    if failed:
        raise LockstepError(f"{topic}: {len(failed)} of {len(records)} records were not delivered: {failed[0]}")
    return len(records)


@dataclass
class RateGenerator:
    """Produces JSON records made by ``make`` to ``topic`` (or the topic ``make`` names) at
    ``rate`` records per second."""

    settings: Settings
    topic: str
    rate: int
    make: RecordMaker = field(default_factory=purchases)
    seed: int = 7
    sent: int = 0
    failed: int = 0
    rng: random.Random = field(init=False)
    producer: Producer = field(init=False)

    def __post_init__(self) -> None:
        if self.rate < 1:
            raise ValueError("rate must be at least 1")
        self.rng = random.Random(self.seed)
        self.producer = Producer(self.settings.kafka_config({"linger.ms": 5, "compression.type": "lz4"},
                                                               client="lockstep-datagen"))

    def _delivered(self, error: object, _message: object) -> None:
        if error is not None:
            self.failed += 1

    def _produce(self, ts: int) -> None:
        key, record, *where = self.make(self.rng, ts)
        value = json.dumps(record).encode()
        while True:
            try:
                self.producer.produce(where[0] if where else self.topic, value, key=key.encode(),
                                      on_delivery=self._delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain
                self.producer.poll(0.05)
        self.sent += 1

    def run(self, stop: threading.Event, seconds: float | None = None,
            progress: Callable[[str], None] | None = None, every: float = 5.0) -> int:
        """Produce at ``rate`` records/s until ``stop`` is set or ``seconds`` pass; flush; return
        the number sent. If the machine cannot keep up, the rate reported by ``progress`` says so."""
        started = time.monotonic()
        next_report = started + every
        while not stop.is_set():
            now = time.monotonic()
            elapsed = now - started
            if seconds is not None and elapsed >= seconds:
                break
            due = min(int(elapsed * self.rate) - self.sent, self.rate)  # at most a second's worth per step
            ts = int(time.time() * 1000)
            for _ in range(max(due, 0)):
                self._produce(ts)
            self.producer.poll(0)
            if progress is not None and now >= next_report:
                progress(f"sent {self.sent:,} records ({self.sent / elapsed:,.0f}/s, target {self.rate:,}/s)")
                next_report += every
            time.sleep(0.005)
        left = self.producer.flush(30)
        self.failed += left
        return self.sent
