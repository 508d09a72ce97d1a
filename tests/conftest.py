"""Shared fixtures: one real Kafka broker and one SparkSession per test session.

Kafka comes from ``LOCKSTEP_BOOTSTRAP`` if set, else a testcontainers Kafka if a Docker
engine answers, else the same local broker ``lockstep dev up`` runs, on a free port, stopped
at the end. Fixtures that make things are factories: call them as often as a test needs.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import hypothesis
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from coordinator.client.topics import create_topics
from coordinator.settings import Settings
from lockstep.dev.broker import LocalBroker
from lockstep.dev.s3 import LocalS3
from tests.support import ROOT, up_on_a_free_port

pytest_plugins = ["tests.support.workers", "tests.support.states", "tests.support.pipelines", "tests.support.browser",
                  "tests.support.http_sink", "tests.support.cdc", "tests.support.clicks", "tests.support.serving"]

# Fixtures that start a server, a JVM or a browser: a test using one (directly or through another
# fixture, such as ``settings``) is marked ``integration`` here, so the fast tier (``-m "not
# integration and not slow"``, run first by scripts/test) never waits for one.
SERVER_FIXTURES = frozenset({"kafka_bootstrap", "spark", "local_s3", "cdc_stack", "make_browser"})


# No per-example deadline: on a busy 2-core machine a pure fold's example can take past
# hypothesis' 200 ms, and a slow example is not a wrong one.
hypothesis.settings.register_profile("lockstep", deadline=None)
hypothesis.settings.load_profile("lockstep")

# The files that take minutes each (fresh-clone runs on 2 cores), longest first, those that start
# JVMs of their own (drills: jobs, brokers, clusters) between those that use the session's Spark:
# on scripts/test's two workers the long files start first, the short ones fill the end, and two
# drills seldom run at once (a Python worker Spark starts must connect back within 10 s).
LONGEST_FIRST = (
    "tests/spark_jobs/runtime/test_ivm.py",
    "tests/drills/test_exactly_once.py",
    "tests/spark_jobs/runtime/maintenance/test_keyed.py",
    "tests/drills/test_revise.py",
    "tests/spark_jobs/ops/test_upkeep.py",
    "tests/drills/test_kafka_cluster.py",
    "tests/spark_jobs/ops/test_runner.py",
    "tests/drills/test_start_under_load.py",
    "tests/drills/test_recreated_pipeline.py",
    "tests/spark_jobs/api/test_reads.py",
    "tests/lockstep/test_demo.py",
    "tests/lockstep_reads/test_snapshot.py",
    "tests/drills/test_broker_outage.py",
    "tests/spark_jobs/runtime/test_catalog.py",
    "tests/drills/test_spark_cluster.py",
    "tests/spark_jobs/ops/test_vacuum.py",
    "tests/drills/test_money_moves.py",
)
CDC_GROUP = "cdc"  # the files that use the cdc_stack: one worker starts PostgreSQL, a registry and Connect


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that use a server ``integration``; give each test its file as its
    ``xdist_group`` (scripts/test's ``--dist loadgroup``: a file per worker), except that the
    files using the ``cdc_stack`` share one; and start the longest files first."""
    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    cdc_files = {file_of(item) for item in items if "cdc_stack" in getattr(item, "fixturenames", ())}
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        item.add_marker(pytest.mark.xdist_group(CDC_GROUP if file_of(item) in cdc_files else file_of(item)))
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(file_of(item), len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="session")
def base_settings() -> Settings:
    """Settings from the environment, with jars defaulting to this checkout's cache."""
    settings = Settings.from_env()
    if "LOCKSTEP_JARS" not in os.environ:
        settings = dataclasses.replace(settings, jars=ROOT / ".lockstep" / "jars")
    return settings


def docker_engine_available() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:  # noqa: BLE001 - no client library, no engine, a refused socket: all mean "no Docker"
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a real Kafka broker for the whole test session."""
    if "LOCKSTEP_BOOTSTRAP" in os.environ:
        yield os.environ["LOCKSTEP_BOOTSTRAP"]
    elif docker_engine_available():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            yield container.get_bootstrap_server()
    else:
        home = tmp_path_factory.mktemp("kafka")
        broker = up_on_a_free_port(lambda port: LocalBroker(home=home, jars=base_settings.jars / "kafka", port=port))
        try:
            yield broker.bootstrap
        finally:
            # close leftover clients first, so they do not log reconnect failures at exit: the
            # snapshots' lease clients (kept per coordinator for the process), then the unreferenced
            from coordinator.client.snapshots import close_clients

            close_clients()
            gc.collect()
            broker.down()


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    """A fresh, empty warehouse folder for one test."""
    path = tmp_path / "warehouse"
    path.mkdir()
    return path


@pytest.fixture
def settings(base_settings: Settings, kafka_bootstrap: str, warehouse: Path) -> Settings:
    """Settings pointing at the session's broker and this test's warehouse."""
    return dataclasses.replace(base_settings, bootstrap=kafka_bootstrap, warehouse=str(warehouse))


@pytest.fixture
def make_topic(kafka_bootstrap: str) -> Iterator[Callable[..., str]]:
    """Factory: ``make_topic(partitions=1, config={...})`` creates a uniquely named topic."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    created: list[str] = []

    def make(partitions: int = 1, config: dict[str, str] | None = None, prefix: str = "t") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        create_topics(admin, [NewTopic(name, partitions, 1, config=config or {})])
        created.append(name)
        return name

    yield make
    if created:
        for future in admin.delete_topics(created).values():
            future.result(timeout=30)


@pytest.fixture
def read_topic(kafka_bootstrap: str) -> Callable[[str], list[tuple[int, int, bytes | None, bytes | None]]]:
    """Factory: ``read_topic(name)`` -> every record from the beginning as (partition, offset, key, value)."""

    def read(topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
        consumer = Consumer(
            {"bootstrap.servers": kafka_bootstrap, "group.id": f"read-{uuid.uuid4().hex}", "enable.auto.commit": False}
        )
        try:
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            out = []
            for p in partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                if high <= low:
                    continue
                consumer.assign([TopicPartition(topic, p, low)])
                while True:
                    msg = consumer.poll(10)
                    assert msg is not None, f"timed out reading {topic}[{p}]"
                    assert msg.error() is None, msg.error()
                    out.append((p, msg.offset(), msg.key(), msg.value()))
                    if msg.offset() >= high - 1:
                        break
            return out
        finally:
            consumer.close()

    return read


# The test session runs thousands of query shapes, far more than the 100 whose generated code Spark
# keeps: each one evicted was compiled again at its next barrier (and its new classes JIT-compiled
# again). CONTRIBUTING.md ("The two tiers") has what the room saves.
SESSION_CONF = {"spark.sql.codegen.cache.maxEntries": "5000"}


@pytest.fixture(scope="session")
def spark(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """The one SparkSession of the test session (local[2], 2 shuffle partitions, UI off, the
    s3a:// file system on its classpath)."""
    from spark_jobs.runtime.session import build_session

    settings = dataclasses.replace(base_settings, warehouse=str(tmp_path_factory.mktemp("spark-warehouse")))
    session = build_session("lockstep-tests", settings=settings, object_store=True,  # s3a:// tests share it
                            conf=SESSION_CONF)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def local_s3(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3]:
    """A real S3-API server (s3proxy, as ``lockstep dev up --s3`` runs it) with the bucket ``lake``."""
    home = tmp_path_factory.mktemp("s3")
    s3 = up_on_a_free_port(lambda port: LocalS3(home, base_settings.jars / "s3proxy", port, buckets=("lake",)))
    try:
        yield s3
    finally:
        s3.down()


@pytest.fixture
def table_path(warehouse: Path) -> Callable[[str], str]:
    """Factory: ``table_path("orders")`` -> a path for a Delta table in this test's warehouse."""
    return lambda name: str(warehouse / name)

