"""End offsets of partitions, asked of their current leaders: what the barrier clock cuts and
what a state reader reads up to.

librdkafka's admin client keeps the partition leaders and leader epochs it first learned: after
a broker dies and leadership moves, its offset requests keep failing (FENCED_LEADER_EPOCH, or
"unknown partition" from a client that never read the topic) instead of refreshing. So each
failure that a leader change explains makes a new client, with fresh metadata, and asks again
for up to ``RETRY_S`` seconds. An end it answers for a partition whose leader just died can be
-1001 (no offset) without an error: that counts as such a failure too, never as a cut.

While a request waits on a leader that died, librdkafka 2.16's admin client reconnects to it
without pause (tens of thousands of refused connects a second, a core's worth of CPU) until the
request times out. So a request waits ``REQUEST_S`` at most, and after a timeout no request is
outstanding for ``PAUSE_S``: until the cluster elects a new leader, half the time spins, not all.

Example::

    offsets = EndOffsets(settings)
    offsets.latest([TopicPartition("orders", 0)], committed=True)   # {TopicPartition(...): 1234}
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]  # exported, not in __all__
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay

from coordinator.settings import Settings

RETRY_S = 30.0
REQUEST_S = 2.0  # one request's wait; a live leader answers in milliseconds
PAUSE_S = 2.0  # the wait after a request timed out: no client asks a leader that does not answer
TIMEOUTS = frozenset({KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT})
# Errors that pass once the cluster has (re)elected the partition's leader and the client knows it
LEADER_CHANGES = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.REQUEST_TIMED_OUT,
    KafkaError._UNKNOWN_PARTITION, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
})


def _pause(retry: RetryCallState) -> float:
    """Seconds to wait before asking again: ``PAUSE_S`` after a timeout, else a moment."""
    exc = retry.outcome.exception() if retry.outcome else None
    return PAUSE_S if isinstance(exc, KafkaException) and exc.args[0].code() in TIMEOUTS else 0.2


def leader_changing(exc: BaseException) -> bool:
    """Whether ``exc`` is a broker error that a leader change (or a topic created a moment ago) explains."""
    return isinstance(exc, KafkaException) and exc.args[0].code() in LEADER_CHANGES


class EndOffsets:
    """One admin client for offset and topic-metadata requests, renewed after a leader change."""

    def __init__(self, settings: Settings) -> None:
        self._config = settings.kafka_config({"log_level": 3}, client="lockstep-offsets")
        self._lock = threading.Lock()
        self._admin: AdminClient | None = AdminClient(self._config)

    def _renew(self, _retry: RetryCallState) -> None:
        with self._lock:
            if self._admin is not None:
                self._admin = AdminClient(self._config)

    def _current(self) -> AdminClient:
        if self._admin is None:
            raise RuntimeError("end offsets asked of a closed EndOffsets")
        return self._admin

    def close(self) -> None:
        """Let go of the admin client: librdkafka closes its connections once it is freed, so no
        client outlives the broker it talks to."""
        with self._lock:
            self._admin = None

    def latest(self, partitions: Iterable[TopicPartition], committed: bool = False) -> dict[TopicPartition, int]:
        """Each partition's end: with ``committed``, the last stable offset (what a read_committed
        reader can reach); else the high watermark."""
        return self._list({tp: OffsetSpec.latest() for tp in partitions}, committed)  # type: ignore[no-untyped-call]

    def earliest(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's first offset (where its log starts now)."""
        return self._list({tp: OffsetSpec.earliest() for tp in partitions}, committed=True)  # type: ignore[no-untyped-call]

    def at_time(self, partitions: Iterable[TopicPartition], ts_ms: int) -> dict[TopicPartition, int]:
        """Each partition's first offset whose record's timestamp is at or after ``ts_ms``; -1 for
        a partition with no record that late."""
        return self._list({tp: OffsetSpec.for_timestamp(ts_ms) for tp in partitions}, committed=True, missing_ok=True)

    def _list(self, request: dict[TopicPartition, Any], committed: bool, missing_ok: bool = False) -> dict[TopicPartition, int]:
        """Offsets as ``request`` specifies them per partition. An answer of -1 is a leader that
        is changing and is asked again, unless ``missing_ok`` (a timestamp no record reaches)."""
        request = {TopicPartition(tp.topic, tp.partition): spec for tp, spec in request.items()}
        isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        for attempt in Retrying(retry=retry_if_exception(leader_changing), stop=stop_after_delay(RETRY_S),
                                wait=_pause, before_sleep=self._renew, reraise=True):
            with attempt:
                futures = self._current().list_offsets(request, isolation_level=isolation, request_timeout=REQUEST_S)
                answers = {tp: int(future.result().offset) for tp, future in futures.items()}
                if unknown := sorted(f"{tp.topic}[{tp.partition}]" for tp, offset in answers.items()
                                     if offset < 0 and not (missing_ok and offset == -1)):
                    raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE,
                                                    f"no offset for {', '.join(unknown)} (its leader changes)"))
        return answers

    def topics(self) -> dict[str, Any]:
        """The cluster's topics (name -> TopicMetadata) as its metadata says now."""
        return dict(self._current().list_topics(timeout=10).topics)
