"""At most one barrier clock writes: the leader's writes go through one Kafka transactional id.

A leader paused past its session timeout (a long GC, SIGSTOP, a frozen VM) does not know it
was replaced; resumed, it would finish the tick it was in and announce a barrier id the new
leader has already announced with another cut. Every leader writes through a transactional
producer with the same ``transactional.id`` (one per coordinator, from the topic prefix), and
starts it before it reads the state it plans from: starting it makes the broker abort the old
leader's open transaction and refuse its every later write (Kafka's producer fencing). So what
a new leader plans from is final, and a stale leader's write fails with ``Fenced`` instead of
reaching any reader (every state reader reads committed records only).

Example::

    writer = FencedWriter(settings)
    writer.start()                      # fences every earlier leader
    state = read_the_state()            # nothing an earlier leader writes can change it now
    writer.write([(topic, key, value)])
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Producer

from coordinator.client.delivery import Delivered
from coordinator.settings import Settings

log = logging.getLogger(__name__)

TRANSACTION_TIMEOUT_MS = 10_000  # a dead leader's open transaction blocks readers at most this long
FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


class Fenced(Exception):
    """A newer leader has started writing; this worker must not write until it leads again."""


class FencedWriter:
    """The leader's producer (see the module). ``rejoin()`` after a rebalance lets a worker
    that was fenced start again if it leads once more (its start then fences the other)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.transactional_id = f"{settings.topic_prefix}-coordinator-leader"
        self.fenced = False
        self._producer: Producer | None = None
        # The leader's timers run in executor threads; a producer runs one transaction at a time.
        self._lock = threading.RLock()

    def start(self) -> None:
        """Become the only writer (idempotent): from here on no earlier leader's write lands."""
        with self._lock:
            if self.fenced:
                raise Fenced(f"another leader took over {self.transactional_id}; this worker writes again only "
                             "when a rebalance makes it the leader")
            if self._producer is None:
                producer = Producer(self.settings.kafka_config({
                    "transactional.id": self.transactional_id,
                    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                    "linger.ms": 0,
                }, client="lockstep-leader"))
                self._call(lambda: producer.init_transactions(30))
                self._producer = producer

    def write(self, records: list[tuple[str, bytes, bytes | None]]) -> dict[str, int]:
        """Write ``(topic, key, value)`` records in one transaction; returns, per topic, the
        offset after the last one (for ``StateFollower.wait_for``)."""
        with self._lock:
            self.start()
            producer = self._producer
            assert producer is not None
            return self._transaction(producer, records)

    def _transaction(self, producer: Producer, records: list[tuple[str, bytes, bytes | None]]) -> dict[str, int]:
        delivered = Delivered()

        def transaction() -> None:
            producer.begin_transaction()
            for topic, key, value in records:
                producer.produce(topic, key=key, value=value, on_delivery=delivered)
            producer.commit_transaction(30)

        self._call(transaction, abort=True)
        return delivered.marks

    @property
    def leading(self) -> bool:
        """Whether this worker has started as the writer and no newer leader has fenced it."""
        return self._producer is not None and not self.fenced

    def rejoin(self) -> None:
        """A rebalance happened: if this worker leads again, it may start (and fence) again."""
        self.fenced = False

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None

    def _call(self, work: Callable[[], None], abort: bool = False) -> None:
        """Run ``work``; on a fencing error remember it and raise ``Fenced``; on an error the
        transaction must be aborted for, abort it; after any other error (fatal, or a commit
        that timed out: its outcome unknown) drop the producer, so the next write starts a new
        one, whose start aborts whatever this one left open."""
        try:
            work()
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() in FENCED_CODES:
                self.fenced, self._producer = True, None
                log.warning("fenced: another leader took over %s (%s); this worker writes nothing until it leads "
                            "again", self.transactional_id, error.str())
                raise Fenced(error.str()) from exc
            if abort and error.txn_requires_abort() and not error.fatal() and self._producer is not None:
                try:
                    self._producer.abort_transaction(30)
                except KafkaException:
                    self._producer = None
            else:
                self._producer = None
            raise
