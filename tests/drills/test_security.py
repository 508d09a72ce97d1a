"""A pipeline on a broker that authenticates (SASL/PLAIN) and authorises (KRaft StandardAuthorizer).

Each Lockstep process runs as its own principal with only the ACLs of its role
(``coordinator.client.acls``): the worker as ``coordinator``, the Spark jobs as ``jobs``, a
consistent read as ``reader``. So the test shows both that the roles' ACLs are enough for all
three client stacks (confluent-kafka, Faust's aiokafka, Spark's Java Kafka source) and that a
principal without them cannot write a command or a state record.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from coordinator.client.acls import grant
from coordinator.client.commands import emit, new_request_id
from coordinator.client.topics import Topics, create_topics
from coordinator.dev.broker import LocalBroker, free_port
from coordinator.domain import DeclareTable
from coordinator.domain.errors import NotAuthorised
from coordinator.settings import Settings
from spark_jobs.api.reads import open_snapshot
from spark_jobs.ops.runner import register_pipeline, start_jobs
from spark_jobs.planning.pipeline import parse_pipeline
from tests.support.barriers import read_state, wait_for_barrier
from tests.support.workers import Worker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

USERS = {"admin": "adminsecret", "coordinator": "coordsecret", "jobs": "jobssecret", "reader": "readersecret",
         "intruder": "intrudersecret"}
PIPELINE = """
CREATE TABLE sales (shop BIGINT, amount BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE per_shop AS SELECT shop, SUM(amount) AS total FROM sales GROUP BY shop;
"""


@pytest.fixture(scope="module")
def secured_broker(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    broker = LocalBroker(tmp_path_factory.mktemp("secured-kafka"), base_settings.jars / "kafka", port=free_port(),
                         users=USERS)
    broker.up()
    try:
        yield broker
    finally:
        gc.collect()  # close leftover clients first, so they do not log reconnect failures at exit
        broker.down()


def delivery_error(config: dict[str, str], topic: str) -> KafkaError | None:
    """Produce one record as ``config``'s principal; the error it was refused with, if any."""
    errors: list[KafkaError | None] = []
    producer = Producer({**config, "log_level": 0, "message.timeout.ms": 10000})
    producer.produce(topic, key=b"forged", value=b"forged", on_delivery=lambda err, _: errors.append(err))
    producer.flush(15)
    return errors[0] if errors else None


def test_each_role_runs_with_its_acls_and_a_principal_without_them_writes_nothing(
    secured_broker: LocalBroker, base_settings: Settings, spark: SparkSession, tmp_path: Path,
) -> None:
    prefix, topic = f"sec{uuid.uuid4().hex[:6]}", f"sales{uuid.uuid4().hex[:6]}"
    common = {"LOCKSTEP_TOPIC_PREFIX": prefix, "LOCKSTEP_HOME": str(tmp_path / "home"),
              "LOCKSTEP_JARS": str(base_settings.jars), "LOCKSTEP_BARRIER_INTERVAL_MS": "200"}
    plain = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}

    def env(user: str) -> dict[str, str]:
        return {**plain, **common, **secured_broker.env(user)}

    admin = Settings.from_env(env("admin"))
    kafka_admin = AdminClient(secured_broker.client_config())
    create_topics(kafka_admin, [NewTopic(topic, 2, 1)])
    for user, role in (("coordinator", "coordinator"), ("jobs", "job"), ("reader", "reader")):
        grant(admin, f"User:{user}", role, [topic])

    port = free_port()
    worker = Worker({**env("coordinator"), "LOCKSTEP_COORDINATOR_URL": f"http://127.0.0.1:{port}"}, port,
                    tmp_path / "worker.log").start()
    runs = []
    try:
        place = {"warehouse": str(tmp_path / "wh"), "coordinator_url": worker.url}
        jobs = dataclasses.replace(Settings.from_env(env("jobs")), **place)
        reader = dataclasses.replace(Settings.from_env(env("reader")), **place)
        pipeline = parse_pipeline(PIPELINE.format(topic=topic))
        register_pipeline(jobs, pipeline)
        runs = start_jobs(spark, pipeline, jobs)

        producer = Producer(secured_broker.client_config())
        for i in range(100):
            producer.produce(topic, json.dumps({"shop": i % 4, "amount": i}).encode(), partition=i % 2)
        producer.flush(10)
        wait_for_barrier(jobs, ["sales", "per_shop"], {0: 50, 1: 50}, topic)
        with open_snapshot(spark, ["sales", "per_shop"], "read-committed", settings=reader) as snap:
            totals = {r.shop: r.total for r in snap.table("per_shop").collect()}
            assert snap.table("sales").count() == 100
        assert totals == {shop: sum(range(shop, 100, 4)) for shop in range(4)}

        # a principal without ACLs: its command is refused by the broker, with a message that says so
        intruder = Settings.from_env(env("intruder"))
        with pytest.raises(NotAuthorised, match="User:intruder"):
            emit(intruder, DeclareTable(new_request_id(), "forged", "root"), timeout=10)
        topics = Topics(prefix)
        assert delivery_error(secured_broker.client_config("intruder"), topics.commands).code() \
            == KafkaError.TOPIC_AUTHORIZATION_FAILED
        # jobs and readers write commands (and jobs completions), never the coordinator's state
        for user in ("intruder", "reader", "jobs"):
            for state_topic in (topics.barriers, topics.registry, topics.leases):
                error = delivery_error(secured_broker.client_config(user), state_topic)
                assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (user, state_topic)
        assert delivery_error(secured_broker.client_config("reader"), topics.completions).code() \
            == KafkaError.TOPIC_AUTHORIZATION_FAILED
        state = read_state(jobs)
        assert "forged" not in state.tables and set(state.tables) == {"sales", "per_shop"}
    finally:
        for run in runs:
            run.query.stop()
            run.processor.close()
        worker.stop()
