"""A pipeline made again under the same names, as users do it: the same table names run a second
time with a new warehouse and topic prefix, and a third time in that warehouse after `lockstep
drop`, all sharing one LOCKSTEP_HOME (where an older Lockstep kept every job's checkpoint by job
name, so a second pipeline resumed the first one's and skipped 5,000 of 8,000 records). Each run
reads a topic that already holds records while a producer keeps writing before, during and after
`lockstep run` starts (2 partitions, then 6); the first run's job process and the second run's
coordinator are killed with SIGKILL right after the root's first commit. Each time the root must
hold exactly the records its start rule names (earliest, latest, a timestamp), each once."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from coordinator.client.state import read_state
from coordinator.client.topics import create_topics
from coordinator.domain import MetaState
from coordinator.domain.errors import ExitCode
from coordinator.settings import Settings
from lockstep.dev.broker import free_port
from tests.support import lockstep_in_process, wait_until
from tests.support.barriers import at
from tests.support.starts import RunProcess
from tests.support.workers import Worker

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1500), pytest.mark.barrier_interval_ms(500)]

PIPELINE = """
CREATE TABLE rs_events (id BIGINT, v BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json', 'start' = '{start}');
CREATE TABLE rs_totals AS SELECT v, COUNT(*) AS n FROM rs_events GROUP BY v;
"""
RATE = 300  # records a second, while `lockstep run` starts, runs and is killed
ALREADY_THERE = 1500  # records the topic holds before the producer starts its steady pace


class Feed(threading.Thread):
    """Records {"id", "v"} with ids 0, 1, ... spread over a topic's partitions; each delivered
    record's topic, partition, offset and timestamp are kept by id: the oracle of what a start
    rule names."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(name="recreate-feed", daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.topic, self.partitions, self.sent = "", 1, 0
        self.delivered: dict[int, tuple[str, int, int, int]] = {}  # id -> (topic, partition, offset, ts ms)
        self.pace = threading.Event()  # set: RATE a second; clear: paused
        self.halt = threading.Event()

    def use(self, topic: str, partitions: int) -> None:
        """Produce to ``topic``, made here with ``partitions``, from now on (paused)."""
        self.pace.clear()
        self.producer.flush(30)
        create_topics(self.admin, [NewTopic(topic, partitions, 1)])
        self.topic, self.partitions = topic, partitions

    def burst(self, n: int) -> None:
        for _ in range(n):
            self._send()
        assert self.producer.flush(30) == 0

    def _send(self) -> None:
        i, topic = self.sent, self.topic
        self.sent += 1

        def delivered(err: KafkaError | None, msg: Message) -> None:
            assert err is None, err
            self.delivered[i] = (topic, msg.partition(), msg.offset(), msg.timestamp()[1])

        self.producer.produce(topic, json.dumps({"id": i, "v": i % 7}).encode(), partition=i % self.partitions,
                              on_delivery=delivered)

    def run(self) -> None:
        while not self.halt.is_set():
            if self.pace.wait(0.1):
                began, count = time.monotonic(), 0
                while self.pace.is_set() and not self.halt.is_set():
                    due = int((time.monotonic() - began) * RATE) - count
                    for _ in range(max(due, 0)):
                        self._send()
                    count += max(due, 0)
                    self.producer.poll(0)
                    time.sleep(0.02)
                self.producer.flush(30)

    def ends(self) -> dict[int, int]:
        """partition -> the end offset of what was delivered to the current topic."""
        assert self.producer.flush(30) == 0
        ends: dict[int, int] = {}
        for topic, partition, offset, _ in self.delivered.values():
            if topic == self.topic:
                ends[partition] = max(ends.get(partition, 0), offset + 1)
        return ends

    def ids(self, since: dict[int, int] | None = None, stamped_from: int = 0) -> list[int]:
        """Ids delivered to the current topic at or after ``since`` (partition -> offset) in their
        partition and stamped at or after ``stamped_from`` (epoch ms), sorted."""
        return sorted(i for i, (topic, p, offset, ts) in self.delivered.items()
                      if topic == self.topic and offset >= (since or {}).get(p, 0) and ts >= stamped_from)


@dataclass
class Runs:
    """The drill's runs: one shared LOCKSTEP_HOME, each run's own prefix and warehouse."""

    env: dict[str, str]
    tmp_path: Path
    spark: SparkSession
    feed: Feed

    def settings(self, prefix: str, warehouse: str, port: int) -> tuple[dict[str, str], Settings]:
        env = {**self.env, "LOCKSTEP_TOPIC_PREFIX": prefix, "LOCKSTEP_WAREHOUSE": str(self.tmp_path / warehouse),
               "LOCKSTEP_HOME": str(self.tmp_path / "home"), "LOCKSTEP_COORDINATOR_URL": f"http://127.0.0.1:{port}"}
        return env, Settings.from_env(env)

    def start(self, env: dict[str, str], name: str, topic: str, start: str) -> RunProcess:
        pipeline = self.tmp_path / f"{name}.sql"
        pipeline.write_text(PIPELINE.format(topic=topic, start=start))
        return RunProcess(pipeline, env, self.tmp_path / f"{name}.log")

    def first_commit(self, run: RunProcess) -> None:
        wait_until(lambda: run.said("job ingest_rs_events committed barrier") is not None or run.proc.poll() is not None,
                   "the root's first commit", timeout=180)
        assert run.proc.poll() is None, "\n".join(line for _, line in run.lines[-30:])

    def settle(self, settings: Settings, run: RunProcess) -> MetaState:
        """Pause the producer, wait until both tables hold everything sent, stop `lockstep run`."""
        self.feed.pace.clear()
        ends = self.feed.ends()

        def covered() -> MetaState | None:
            state = read_state(settings)
            b = state.common_barrier(["rs_events", "rs_totals"])
            cut = {c.partition: c.offset for c in state.barriers[b].cut if c.topic == self.feed.topic} if b else {}
            return state if b and all(cut.get(p, 0) >= end for p, end in ends.items()) else None

        state = wait_until(covered, "an exact point of both tables past every record sent", timeout=180)
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(60) == ExitCode.TERMINATED
        return state

    def held(self, settings: Settings, state: MetaState) -> list[int]:
        """The ids the root holds at the newest exact point of both tables, sorted (copies kept)."""
        b = state.common_barrier(["rs_events", "rs_totals"])
        assert b is not None
        events = at(self.spark, settings, "rs_events", state.exact_points("rs_events")[b]).collect()
        totals = at(self.spark, settings, "rs_totals", state.exact_points("rs_totals")[b]).collect()
        assert sum(r["n"] for r in totals) == len(events)  # the aggregate agrees with its root
        return sorted(r["id"] for r in events)


def test_a_pipeline_made_again_under_the_same_names_holds_what_its_start_rule_names_each_once(
    spark: SparkSession, kafka_bootstrap: str, coordinator_env: dict[str, str], tmp_path: Path,
) -> None:
    feed = Feed(kafka_bootstrap)
    feed.start()
    runs = Runs({**coordinator_env, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", "python")}, tmp_path, spark, feed)
    try:
        # 1. earliest, 2 partitions; the job process is killed after the root's first commit
        topic = f"rs_{uuid.uuid4().hex[:8]}"
        feed.use(topic, partitions=2)
        feed.burst(ALREADY_THERE)
        feed.pace.set()
        port = free_port()
        env, settings = runs.settings(f"rs1{uuid.uuid4().hex[:6]}", "wh1", port)
        worker = Worker(env, port, tmp_path / "worker-1.log").start()
        try:
            run = runs.start(env, "first", topic, "earliest")
            runs.first_commit(run)
            run.kill()  # SIGKILL to its process group: `lockstep run`, its JVM, its Python workers
            run = runs.start(env, "first-again", topic, "earliest")
            runs.first_commit(run)
            state = runs.settle(settings, run)
            assert runs.held(settings, state) == feed.ids() == list(range(feed.sent))  # every record, once
        finally:
            worker.stop()

        # 2. the same names, a new prefix and warehouse, latest, 6 partitions; the coordinator is killed
        topic = f"rs_{uuid.uuid4().hex[:8]}"
        feed.use(topic, partitions=6)
        feed.burst(ALREADY_THERE)
        feed.pace.set()
        time.sleep(1)  # records keep coming while `lockstep run` starts
        before_run = feed.ends()
        port = free_port()
        env, settings = runs.settings(f"rs2{uuid.uuid4().hex[:6]}", "wh2", port)
        worker = Worker(env, port, tmp_path / "worker-2.log").start()
        try:
            run = runs.start(env, "second", topic, "latest")
            runs.first_commit(run)
            at_first_commit = feed.ends()
            worker.kill9()
            done = read_state(settings).latest_exact("rs_events") or 0
            worker = Worker(env, port, tmp_path / "worker-2b.log").start()
            wait_until(lambda: (read_state(settings).latest_exact("rs_events") or 0) > done + 2,
                       "the root commits barriers of the restarted coordinator")
            state = runs.settle(settings, run)
            starts = {c.partition: c.offset for c in state.tables["rs_events"].start_offsets}
            assert sorted(starts) == list(range(6))
            assert all(before_run.get(p, 0) <= starts[p] <= at_first_commit.get(p, 0) for p in range(6)), \
                (before_run, starts, at_first_commit)  # latest: the ends when `lockstep run` declared it
            expected = feed.ids(since=starts)
            assert runs.held(settings, state) == expected and len(expected) > 0
            status = lockstep_in_process("status", env=env)
            assert status.returncode == 0, status.stderr
            assert f"rs_events started reading at latest: {topic}[0] from offset {starts[0]}" in status.stdout

            # 3. the same coordinator and warehouse after `lockstep drop`: from a timestamp on
            for job in ("ingest_rs_events", "maintain_rs_totals"):
                stopped = lockstep_in_process("stop", job, env=env)
                assert stopped.returncode == 0, stopped.stderr
            for table in ("rs_totals", "rs_events"):
                dropped = lockstep_in_process("drop", table, env=env)
                assert dropped.returncode == 0, dropped.stderr
            assert not Path(tmp_path, "wh2", "rs_events").exists()
            assert not list(settings.checkpoints.glob(f"{settings.topic_prefix}/rs_events-*"))  # its checkpoints too
            since = feed.delivered[expected[len(expected) // 2]][3]  # a record's time after the second run began
            feed.pace.set()
            run = runs.start(env, "third", topic, f"timestamp:{since}")
            runs.first_commit(run)
            state = runs.settle(settings, run)
            assert runs.held(settings, state) == feed.ids(stamped_from=since)
            assert state.tables["rs_events"].start == f"timestamp:{since}"
        finally:
            worker.stop()
    finally:
        feed.halt.set()
        feed.pace.clear()
        feed.join(30)
