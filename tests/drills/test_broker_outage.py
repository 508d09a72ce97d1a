"""The whole pipeline outlives its broker: the broker stops for 35 s under a running pipeline
(the worker's barrier clock, the jobs' Kafka reads, commits and completions, a producer and a
read-committed reader all going on) and starts again. Barriers resume with no id skipped or
repeated, every record is in the tables exactly once (per key, sequence numbers 1..n) and no
read-committed read, before, during or after the outage, saw the aggregate disagree with the
records it was read with."""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from coordinator.client.topics import create_topics
from coordinator.domain.errors import LockstepError
from coordinator.settings import Settings
from lockstep.dev.broker import LocalBroker, free_port
from lockstep_reads import open_snapshot
from spark_jobs.ops.jobs import register_pipeline
from spark_jobs.planning.pipeline import parse_pipeline
from tests.support import wait_until
from tests.support.barriers import SEQUENCED_PIPELINE, check_each_record_once, read_state, wait_for_barrier
from tests.support.supervising import SequencedFeed, supervised

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.barrier_interval_ms(500)]

KEYS = 5
OUTAGE_S = 35  # longer than every client timeout of the worker and the jobs' producers


class Reader(threading.Thread):
    """Read-committed reads of ``events`` and ``per_key`` until halted: in each, per key, the
    aggregate must be the count, max and sum of the records read with it. A read the coordinator
    could not serve (while its broker is away a snapshot may still be served from its state; a
    lease or a read may fail) is counted, not judged."""

    def __init__(self, spark: SparkSession, settings: Settings) -> None:
        super().__init__(daemon=True)
        self.spark, self.settings = spark, settings
        self.reads: list[int] = []  # barriers read
        self.anomalies: list[str] = []
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(1.0):
            try:
                with open_snapshot(["events", "per_key"], settings=self.settings, spark=self.spark) as snap:
                    truth = {r["k"]: (r["n"], r["last_seq"], r["total"]) for r in snap.sql(
                        "SELECT k, COUNT(*) AS n, MAX(seq) AS last_seq, SUM(seq) AS total FROM events GROUP BY k").collect()}
                    seen = {r["k"]: (r["n"], r["last_seq"], r["total"]) for r in snap.table("per_key").collect()}
                    if truth != seen:
                        self.anomalies.append(f"barrier {snap.barrier}: events say {truth}, per_key says {seen}")
                    self.reads.append(snap.barrier or 0)
            except LockstepError as exc:
                self.failures.append(str(exc).splitlines()[0])


@pytest.fixture
def own_broker(base_settings: Settings, tmp_path: Path) -> Iterator[LocalBroker]:
    """A broker of this test's own, which it stops and starts (the session's broker stays up)."""
    broker = LocalBroker(tmp_path / "kafka", base_settings.jars / "kafka", port=free_port())
    broker.up()
    try:
        yield broker
    finally:
        gc.collect()  # close the jobs' leftover clients first, so they do not log reconnect failures at exit
        broker.down()


def test_a_running_pipeline_outlives_its_broker_and_loses_or_duplicates_nothing(
    own_broker: LocalBroker, spark: SparkSession, make_worker: Callable, coordinator_env: dict[str, str], tmp_path: Path,
) -> None:
    coordinator_env["LOCKSTEP_BOOTSTRAP"] = own_broker.bootstrap
    topic = f"events_{tmp_path.name[-8:]}".replace("-", "_")
    admin = AdminClient({"bootstrap.servers": own_broker.bootstrap})
    create_topics(admin, [NewTopic(topic, 2, 1)])
    worker = make_worker()
    settings = dataclasses.replace(Settings.from_env(coordinator_env), warehouse=str(tmp_path / "wh"), home=tmp_path / "home",
                                   coordinator_url=worker.url)
    pipeline = parse_pipeline(SEQUENCED_PIPELINE.format(topic=topic))
    register_pipeline(settings, pipeline)
    feed = SequencedFeed(own_broker.bootstrap, topic, KEYS, pause=0.005)
    reader = Reader(spark, settings)
    reports: list[str] = []
    with supervised(spark, pipeline, settings, report=reports.append, max_backoff=4) as supervisor:
        feed.start()
        wait_for_barrier(settings, ["events", "per_key"], wait_until(feed.ends, "records delivered", 30), topic,
                         timeout=180)
        reader.start()
        wait_until(lambda: len(reader.reads) >= 3, "read-committed reads before the outage", 120)
        reads_before = len(reader.reads)

        own_broker.down()
        time.sleep(OUTAGE_S)
        assert worker.proc is not None and worker.proc.poll() is None, "the worker exited while its broker was away"
        last_before = worker.barrier_ids()[-1]
        own_broker.up()

        wait_until(lambda: worker.barrier_ids()[-1] > last_before + 5, "barriers after the outage", 180)
        assert worker.metric("lockstep_work_failures_total")  # the failures were counted
        feed.halt.set()
        feed.join(90)
        assert not feed.is_alive() and not feed.errors, f"the producer lost records: {feed.errors[:5]}"
        state, b = wait_for_barrier(settings, ["events", "per_key"], feed.ends(), topic, timeout=300)
        wait_until(lambda: len(reader.reads) >= reads_before + 3 and max(reader.reads) >= b, "reads after the outage",
                   120)
        reader.halt.set()
        reader.join(60)
        restarted = dict(supervisor.failures)

    check_each_record_once(spark, settings, state, b, topic, feed.expected())
    ids = sorted(read_state(settings).barriers)
    assert ids == list(range(ids[0], ids[-1] + 1)), "a barrier id was skipped or repeated across the outage"
    assert not reader.anomalies, reader.anomalies[:3]
    print(f"{len(feed.sent)} records, barriers {ids[0]}..{ids[-1]}, {len(reader.reads)} read-committed reads "
          f"({len(reader.failures)} not served: {sorted(set(reader.failures))[:3]}), jobs restarted: {restarted}, "
          f"reports: {reports[-5:]}")
