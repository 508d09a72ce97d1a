"""Running a pipeline under a Supervisor in a test: a background poller, a hook that
remembers what it heard, a producer of keyed records, the `lockstep` CLI against the test's
worker."""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from coordinator.settings import Settings
from spark_jobs.demo.datagen import unit_price
from spark_jobs.ops.hooks import JobEvent, JobHooks
from spark_jobs.ops.runner import Supervisor
from tests.support import ROOT, run_lockstep

# FLIP-276's topology (pipelines/shopping.sql) reading the topic given as {topic}
SHOPPING = (ROOT / "pipelines" / "shopping.sql").read_text().replace("shopping_source", "{topic}")


@dataclass(frozen=True)
class Stack:
    """Settings for a pipeline test (its own warehouse and home, the test's worker)."""

    settings: Settings
    tmp_path: Path

    def lockstep(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run the `lockstep` CLI in a subprocess against this stack."""
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.tmp_path), "LOCKSTEP_BOOTSTRAP": self.settings.bootstrap,
               "LOCKSTEP_COORDINATOR_URL": self.settings.coordinator_url,
               "LOCKSTEP_TOPIC_PREFIX": self.settings.topic_prefix}
        return run_lockstep(*args, env=env, timeout=60)


class Recorder(JobHooks):
    def __init__(self) -> None:
        self.events: list[tuple[str, JobEvent]] = []

    def on_created(self, event: JobEvent) -> None:
        self.events.append(("created", event))

    def on_finished(self, event: JobEvent) -> None:
        self.events.append(("finished", event))

    def on_failed(self, event: JobEvent) -> None:
        self.events.append(("failed", event))

    def on_canceled(self, event: JobEvent) -> None:
        self.events.append(("canceled", event))

    def of(self, job_id: str) -> list[str]:
        return [what for what, event in self.events if event.job_id == job_id]


@contextmanager
def supervised(*args: Any, **kwargs: Any) -> Iterator[Supervisor]:
    """A started Supervisor(*args, **kwargs) polled every 0.5 s in the background; stopped after."""
    supervisor = Supervisor(*args, **kwargs)
    supervisor.start()
    stop = threading.Event()
    watcher = threading.Thread(target=supervisor.run, args=(stop, 0.5), daemon=True)
    watcher.start()
    try:
        yield supervisor
    finally:
        stop.set()
        watcher.join(10)
        supervisor.stop()


class KeyedRecords:
    """Produces {"k": i % keys, "v": value(i)} to a one-partition topic; ``sent`` lists the keys."""

    def __init__(self, bootstrap: str, topic: str, keys: int = 3, value: Callable[[int], int] = lambda i: 1) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap})
        self.topic, self.keys, self.value = topic, keys, value
        self.sent: list[int] = []

    def send(self, n: int) -> dict[int, int]:
        """Send ``n`` more; returns {partition 0: records sent so far}, what wait_for_barrier covers."""
        for _ in range(n):
            i = len(self.sent)
            self.producer.produce(self.topic, json.dumps({"k": i % self.keys, "v": self.value(i)}).encode())
            self.sent.append(i % self.keys)
        self.producer.flush(10)
        return {0: len(self.sent)}


class SequencedFeed(threading.Thread):
    """Writes {"k", "seq"} records, seq counting 1, 2, ... per key, keyed so a key stays in one
    partition, until ``halt`` is set. ``sent`` lists what was delivered as (partition, offset, k,
    seq) and ``errors`` what was not; the producer is idempotent, so its retries across a broker
    outage duplicate nothing in the topic."""

    def __init__(self, bootstrap: str, topic: str, keys: int, pause: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                                  "log_level": 0})
        self.topic, self.keys, self.pause = topic, keys, pause
        self.sent: list[tuple[int, int | None, int, int]] = []
        self.errors: list[str] = []
        self.halt = threading.Event()

    def _delivered(self, err: KafkaError | None, msg: Message, value: dict[str, int]) -> None:
        if err is not None:
            self.errors.append(f"{value}: {err}")
        else:
            self.sent.append((msg.partition(), msg.offset(), value["k"], value["seq"]))

    def run(self) -> None:
        seq: Counter[int] = Counter()
        i = 0
        while not self.halt.is_set():
            k = i % self.keys
            seq[k] += 1
            value = {"k": k, "seq": seq[k]}
            self.producer.produce(self.topic, key=str(k).encode(), value=json.dumps(value).encode(),
                                  on_delivery=lambda err, msg, v=value: self._delivered(err, msg, v))
            self.producer.poll(0)
            i += 1
            time.sleep(self.pause)
        self.producer.flush(60)

    def ends(self) -> dict[int, int]:
        """partition -> the offset after its last delivered record, what wait_for_barrier covers.
        A record whose retry the broker found already written (an idempotent producer across a
        broker's death) is delivered with no offset: the records after it still bound it."""
        ends: dict[int, int] = {}
        for p, off, *_ in self.sent:
            if off is not None:
                ends[p] = max(ends.get(p, 0), off + 1)
        return ends

    def expected(self) -> Counter[int]:
        """key -> how many records of it were delivered (their seqs must be 1..n)."""
        return Counter(k for *_, k, _ in self.sent)


class Shoppers(threading.Thread):
    """Keeps buying: each purchase pays amount x the item's unit price."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic, self.halt, self.sent = topic, threading.Event(), []
        self.rng = random.Random(3)

    def buy(self, n: int) -> None:
        for _ in range(n):
            item, amount = self.rng.randrange(5), self.rng.randrange(1, 4)
            record = {"user_id": self.rng.randrange(4), "item_id": item, "amount": amount, "price": amount * unit_price(item)}
            self.producer.produce(self.topic, json.dumps(record).encode(),
                                  on_delivery=lambda err, msg, r=record: self.sent.append((msg.offset(), r)))
        self.producer.flush(10)

    def run(self) -> None:
        while not self.halt.is_set():
            self.buy(20)
            time.sleep(0.05)
