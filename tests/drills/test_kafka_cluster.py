"""A pipeline on a 3-node KRaft cluster (``lockstep dev up --brokers 3``'s cluster) whose topics
have replication 3 and min.insync.replicas 2 loses a broker, then the active controller, each
killed with SIGKILL under load and started again: no barrier id is skipped, every barrier a
table committed is published once, and every record is in the tables exactly once."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from coordinator.client.offsets import EndOffsets
from coordinator.client.topics import create_topics
from coordinator.domain.errors import Unreachable
from coordinator.settings import Settings
from lockstep.dev.broker import LocalKafkaCluster
from lockstep.dev.service import free_port
from spark_jobs.ops.jobs import register_pipeline
from spark_jobs.planning.pipeline import parse_pipeline
from tests.support import wait_until
from tests.support.barriers import (
    SEQUENCED_PIPELINE,
    check_each_record_once,
    check_published_versions,
    read_state,
    wait_for_barrier,
)
from tests.support.supervising import SequencedFeed, supervised
from tests.support.workers import Worker

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200), pytest.mark.barrier_interval_ms(500)]

KEYS = 5


@pytest.fixture
def cluster(base_settings: Settings, tmp_path: Path) -> Iterator[LocalKafkaCluster]:
    ports: list[int] = []
    for _ in range(3):
        ports.append(free_port(exclude=frozenset(ports)))
    kafka = LocalKafkaCluster(tmp_path / "kafka", base_settings.jars / "kafka", ports)
    kafka.up()
    try:
        yield kafka
    finally:
        kafka.down()


class EndsAsked(threading.Thread):
    """Asks the end offsets of ``partitions`` as the barrier clock does, every 0.5 s, keeping the
    lowest of each answer: a refusal while a leader moves is an answer, a negative end is not."""

    def __init__(self, offsets: EndOffsets, partitions: list[TopicPartition]) -> None:
        super().__init__(daemon=True)
        self.offsets, self.partitions, self.halt = offsets, partitions, threading.Event()
        self.answers: list[int] = []

    def run(self) -> None:
        while not self.halt.wait(0.5):
            with contextlib.suppress(KafkaException):
                self.answers.append(min(self.offsets.latest(self.partitions, committed=True).values()))
        self.offsets.close()


def newest_barrier(worker: Worker) -> int:
    """The newest barrier the worker lists; -1 while it does not answer (its broker connections
    fail over while brokers die and restart beside it on this machine)."""
    try:
        return worker.barrier_ids()[-1]
    except Unreachable:
        return -1


def test_a_pipeline_loses_neither_a_barrier_nor_a_record_when_a_broker_and_then_the_controller_die(
    cluster: LocalKafkaCluster, spark: SparkSession, make_worker: Callable, coordinator_env: dict[str, str],
    tmp_path: Path,
) -> None:
    coordinator_env |= {"LOCKSTEP_BOOTSTRAP": cluster.bootstrap, "LOCKSTEP_REPLICATION_FACTOR": "3"}
    topic = f"events_{os.getpid()}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    create_topics(admin, [NewTopic(topic, 2, 3, config={"min.insync.replicas": "2"})])
    worker = make_worker()
    settings = dataclasses.replace(Settings.from_env(coordinator_env), warehouse=str(tmp_path / "wh"),
                                   home=tmp_path / "home", coordinator_url=worker.url)
    [state_topic] = [t for t in admin.list_topics(timeout=10).topics.values() if t.topic.endswith(".barriers")]
    assert all(len(p.replicas) == 3 for p in state_topic.partitions.values()), "state topics are replicated 3 times"
    pipeline = parse_pipeline(SEQUENCED_PIPELINE.format(topic=topic))
    register_pipeline(settings, pipeline)
    feed = SequencedFeed(cluster.bootstrap, topic, KEYS, pause=0.005)
    reports: list[str] = []
    phases: dict[str, int] = {}
    began = time.monotonic()

    def phase(name: str) -> None:
        nonlocal began
        phases[name], began = round(time.monotonic() - began), time.monotonic()

    with supervised(spark, pipeline, settings, report=reports.append, max_backoff=4) as supervisor:
        feed.start()
        wait_for_barrier(settings, ["events", "per_key"], wait_until(feed.ends, "records delivered", 30), topic,
                         timeout=180)
        phase("first records")
        asking = EndsAsked(EndOffsets(settings), [TopicPartition(topic, p) for p in (0, 1)])
        asking.start()
        controller = cluster.controller_id()
        victims = [next(n for n in cluster.node_ids if n != controller), controller]
        for victim in victims:
            last = worker.barrier_ids()[-1]
            cluster.kill(victim, signal.SIGKILL)
            time.sleep(5)  # the pipeline runs on two brokers (min.insync.replicas 2 still met)
            try:
                wait_until(lambda last=last: newest_barrier(worker) > last + 2, f"barriers with node {victim} dead", 180)
            except AssertionError as exc:
                counters = [line for line in worker.get_text("/metrics").splitlines() if line.startswith("lockstep_")
                            and ("failures" in line or "held_back" in line or "lag" in line)]
                raise AssertionError(f"{exc}; the runner said: {reports[-4:]}; the worker: {counters}") from None
            phase(f"node {victim} dead")
            cluster.node(victim).up()
            phase(f"node {victim} up")
        feed.halt.set()
        feed.join(90)
        assert not feed.is_alive() and not feed.errors, f"the producer lost records: {feed.errors[:5]}"
        state, b = wait_for_barrier(settings, ["events", "per_key"], feed.ends(), topic, timeout=300)
        restarted = dict(supervisor.failures)
        asking.halt.set()
        asking.join(60)
        phase("the rest")

    assert asking.answers and min(asking.answers) >= 0, f"ends asked while leaders died: {sorted(set(asking.answers))[:5]}"
    check_each_record_once(spark, settings, state, b, topic, feed.expected())
    for table in ("events", "per_key"):
        check_published_versions(spark, settings, state, table, b)
    ids = sorted(read_state(settings).barriers)
    assert ids == list(range(ids[0], ids[-1] + 1)), "a barrier id was skipped across the broker deaths"
    print(f"{len(feed.sent)} records; killed nodes {victims} (the second was the controller); barriers "
          f"{ids[0]}..{ids[-1]}; jobs restarted: {restarted}; reports: {reports[-3:]}; seconds: {phases}")
