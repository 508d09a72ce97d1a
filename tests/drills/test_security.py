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
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic, ResourceType
from pyspark.sql import SparkSession

from coordinator.client.acls import grant, grants
from coordinator.client.commands import CommandClient, emit, new_request_id
from coordinator.client.state import StateReader
from coordinator.client.topics import Topics, create_topics
from coordinator.codec import default_codec
from coordinator.domain import (
    AbandonTable,
    AcquireLease,
    BarrierAnnounced,
    BarrierCompleted,
    Command,
    CommandOutcome,
    DeclareTable,
    DeregisterJob,
    DropTable,
    Fact,
    JobState,
    LeaseState,
    MetaState,
    RegisterJob,
    ReleaseLease,
    RenewJob,
    RequestRevision,
    SourceVersion,
    TableState,
    Tombstone,
    entity_key,
    fold,
)
from coordinator.domain.errors import NotAuthorised
from coordinator.domain.roles import COMMAND_ROLES, Role, placement_problem
from coordinator.settings import Settings
from lockstep.dev.broker import LocalBroker, free_port
from lockstep_reads import open_snapshot
from spark_jobs.ops.jobs import register_pipeline, start_jobs
from spark_jobs.planning.pipeline import parse_pipeline
from tests.support import wait_until
from tests.support.barriers import read_state, wait_for_barrier
from tests.support.jvm_logs import jvm_log
from tests.support.workers import Worker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

USERS = {"admin": "adminsecret", "coordinator": "coordsecret", "jobs": "jobssecret", "reader": "readersecret",
         "operator": "opsecret", "intruder": "intrudersecret"}
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
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    """Also: no password appears in any log this wrote (the worker's; the JVM's at INFO, the
    Kafka clients' configurations among them; Python's; the output of this process and its
    children) nor in the jobs' plans and progress."""
    caplog.set_level(logging.INFO)
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
    with jvm_log(spark, tmp_path / "jvm.log", restore=base_settings.spark_log_level or "WARN"):
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
            with open_snapshot(["sales", "per_shop"], "read-committed", settings=reader, spark=spark) as snap:
                totals = {r.shop: r.total for r in snap.table("per_shop").collect()}
                assert snap.table("sales").count() == 100
            assert totals == {shop: sum(range(shop, 100, 4)) for shop in range(4)}

            # a principal without ACLs: its command is refused by the broker, with a message that says so
            intruder = Settings.from_env(env("intruder"))
            with pytest.raises(NotAuthorised, match="User:intruder"):
                emit(intruder, DeclareTable(new_request_id(), "forged", "root"), timeout=10)
            topics = Topics(prefix)
            assert delivery_error(secured_broker.client_config("intruder"), topics.commands_of(Role.READER)).code() \
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
            # no one but the coordinator joins the worker's group (its members are assigned the commands)
            for user in ("reader", "jobs", "operator"):
                error = join_error(secured_broker.client_config(user), f"{prefix}-coordinator", topics.barriers)
                assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, (user, error)
            plans = [run.query._jsq.explainInternal(True) + str(run.query.recentProgress) for run in runs]
        finally:
            for run in runs:
                run.query.stop()
                run.processor.close()
            worker.stop()
    captured = capfd.readouterr()
    written = {name: (tmp_path / name).read_text(errors="replace") for name in ("worker.log", "jvm.log")}
    written |= {"stdout": captured.out, "stderr": captured.err, "Python logging": caplog.text,
                "plans and progress": "\n".join(plans)}
    assert "sasl.jaas.config" in written["jvm.log"], "the jobs' Kafka clients log their configuration at INFO"
    assert "lockstep_barriers" in written["plans and progress"]
    leaks = [(where, user) for where, text in written.items() for user, password in USERS.items() if password in text]
    assert not leaks, f"passwords written: {leaks}"


PRINCIPALS = {"reader": Role.READER, "jobs": Role.JOB, "operator": Role.OPERATOR, "coordinator": Role.COORDINATOR,
              "intruder": None}


def may_write(role: Role | None, topics: Topics, topic: str) -> bool:
    """Whether ``lockstep acls`` lets ``role`` write ``topic`` (a prefixed grant covers the prefix)."""
    if role is None:
        return False
    return any(g.resource == ResourceType.TOPIC and AclOperation.WRITE in g.operations
               and (topic.startswith(g.name) if g.prefixed else topic == g.name) for g in grants(role, topics))


def join_error(config: dict[str, str], group: str, topic: str) -> KafkaError | None:
    """The error a consumer with ``config`` meets joining ``group`` to read ``topic``; None once
    it is assigned partitions."""
    consumer = Consumer({**config, "group.id": group, "log_level": 0})
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is not None and msg.error().code() != KafkaError._PARTITION_EOF:
                return msg.error()
            if consumer.assignment():
                return None
        raise AssertionError(f"neither joined {group} nor refused within 30 s")
    finally:
        consumer.close()


class Attempts:
    """Every principal's producer, and the outcomes of what they send, read as the admin."""

    def __init__(self, broker: LocalBroker, topics: Topics) -> None:
        self.producers = {user: Producer({**broker.client_config(user), "log_level": 0, "linger.ms": 0,
                                          "message.timeout.ms": 10000}) for user in PRINCIPALS}
        self.outcomes: dict[str, CommandOutcome] = {}
        self.codec = default_codec()
        self.consumer = Consumer({**broker.client_config(), "group.id": f"{topics.prefix}-drill", "log_level": 0,
                                  "enable.auto.commit": False})
        _, high = self.consumer.get_watermark_offsets(TopicPartition(topics.outcomes, 0), timeout=10)
        self.consumer.assign([TopicPartition(topics.outcomes, 0, high)])

    def write(self, user: str, topic: str, key: str, value: bytes | None) -> KafkaError | None:
        """The error the broker refused the record with, if any (at once, once the producer knows)."""
        errors: list[KafkaError | None] = []
        try:
            self.producers[user].produce(topic, key=key.encode(), value=value,
                                         on_delivery=lambda err, _: errors.append(err))
        except KafkaException as exc:
            return exc.args[0]
        self.producers[user].flush(15)
        return errors[0] if errors else None

    def outcome(self, request_id: str, timeout: float = 20) -> CommandOutcome:
        deadline = time.monotonic() + timeout
        while request_id not in self.outcomes and time.monotonic() < deadline:
            msg = self.consumer.poll(0.2)
            if msg is not None and msg.error() is None and msg.value():
                outcome = self.codec.decode(msg.value())
                self.outcomes[outcome.request_id] = outcome
        return self.outcomes[request_id]

    def close(self) -> None:
        self.consumer.close()


def folded(settings: Settings) -> StateReader:
    reader = StateReader(settings, Topics(settings.topic_prefix))
    reader.read_to_end()
    reader.close()
    return reader


def test_every_role_tries_every_command_and_writes_every_record_and_gets_what_the_tables_say(
    secured_broker: LocalBroker, base_settings: Settings, tmp_path: Path,
) -> None:
    prefix = f"drill{uuid.uuid4().hex[:6]}"
    topics = Topics(prefix)
    plain = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    common = {"LOCKSTEP_TOPIC_PREFIX": prefix, "LOCKSTEP_HOME": str(tmp_path / "home"),
              "LOCKSTEP_JARS": str(base_settings.jars)}

    def settings_of(user: str) -> Settings:
        return Settings.from_env({**plain, **common, **secured_broker.env(user)})

    for user, role in PRINCIPALS.items():
        if role is not None:
            grant(settings_of("admin"), f"User:{user}", role)
    port = free_port()
    worker = Worker({**plain, **common, **secured_broker.env("coordinator"), "LOCKSTEP_COORDINATOR_URL":
                     f"http://127.0.0.1:{port}"}, port, tmp_path / "worker.log").start()
    operator = CommandClient(settings_of("operator"))
    attempts = Attempts(secured_broker, topics)
    try:
        def setup(*commands: Command) -> None:
            for command in commands:
                outcome = operator.emit(command, role=Role.OPERATOR if type(command).__name__ != "AcquireLease" else None)
                assert outcome.accepted, outcome.reason

        setup(DeclareTable(new_request_id(), "t", "root"), RegisterJob(new_request_id(), "j", "t", external_topics=("src",)))
        completion = BarrierCompleted("j", "t", 1, 0, 3)
        assert attempts.write("jobs", topics.completions, entity_key(completion), attempts.codec.encode(completion)) is None
        wait_until(lambda: worker.get("/tables/t")["exact_points"] == {"1": 3}, "the exact point", timeout=20)
        # a completion adds an exact point only from a job that wrote its table in its generation
        setup(DeclareTable(new_request_id(), "w", "root"), RegisterJob(new_request_id(), "wj", "w", external_topics=("src",)))
        for fact in (BarrierCompleted("wj", "w", 1, 0, 3), BarrierCompleted("j", "w", 2, 0, 4),
                     BarrierCompleted("wj", "w", 3, 1, 5)):
            assert attempts.write("jobs", topics.completions, entity_key(fact), attempts.codec.encode(fact)) is None
        state = folded(settings_of("reader")).state
        assert sorted(state.completions["w"]) == [1, 2, 3] and state.exact_points("w") == {1: 3}

        def trial(kind: str, n: int) -> tuple[Command, Callable[[MetaState], bool] | None]:
            """A command of ``kind`` that its rules accept, set up by the operator, and how the
            state shows that it was done."""
            rid = new_request_id()
            if kind == "AcquireLease":
                return (AcquireLease(rid, f"l{n}", "drill", ("t",), 1, 600_000, f"s{n}"), lambda s: f"l{n}" in s.leases)
            if kind == "ReleaseLease":
                setup(AcquireLease(new_request_id(), f"r{n}", "drill", ("t",), 1, 600_000, f"s{n}"))
                return ReleaseLease(rid, f"r{n}", f"s{n}"), lambda s: f"r{n}" not in s.leases
            if kind == "DeclareTable":
                return DeclareTable(rid, f"d{n}", "root"), lambda s: f"d{n}" in s.tables
            if kind == "RegisterJob":
                setup(DeclareTable(new_request_id(), f"rj{n}", "root"))
                return RegisterJob(rid, f"rj_job{n}", f"rj{n}", external_topics=("src",)), lambda s: f"rj_job{n}" in s.jobs
            if kind == "RenewJob":
                return RenewJob(rid, "j"), None  # a renewal changes only when j was last heard of
            if kind == "DeregisterJob":
                setup(DeclareTable(new_request_id(), f"dj{n}", "root"),
                      RegisterJob(new_request_id(), f"dj_job{n}", f"dj{n}", external_topics=("src",)))
                return DeregisterJob(rid, f"dj_job{n}", "CANCELED"), lambda s: s.jobs[f"dj_job{n}"].status == "CANCELED"
            if kind == "DropTable":
                setup(DeclareTable(new_request_id(), f"dt{n}", "intermediate", ctas=True))  # a job may drop this one
                return DropTable(rid, f"dt{n}"), lambda s: f"dt{n}" not in s.tables
            if kind == "RequestRevision":
                setup(DeclareTable(new_request_id(), f"rv{n}", "root"))
                return RequestRevision(rid, f"rv{n}", 0, full=True), lambda s: s.tables[f"rv{n}"].generation == 1
            setup(DeclareTable(new_request_id(), f"ab{n}", "intermediate", ctas=True))
            return AbandonTable(rid, f"ab{n}", silent_ms=-60_000), lambda s: f"ab{n}" not in s.tables

        # 1. every principal sends every command kind to every command topic
        checks: list[tuple[str, Callable[[MetaState], bool], bool]] = []
        tried = 0
        for user, role in PRINCIPALS.items():
            for topic, speaks_for in topics.command_topics.items():
                for kind in sorted(COMMAND_ROLES):
                    tried += 1
                    where = (user, topic, kind)
                    if not may_write(role, topics, topic):
                        command = DeclareTable(new_request_id(), "never", "root")
                        error = attempts.write(user, topic, command.request_id, attempts.codec.encode(command))
                        assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, where
                        continue
                    command, done = trial(kind, tried)
                    assert attempts.write(user, topic, command.request_id, attempts.codec.encode(command)) is None, where
                    outcome = attempts.outcome(command.request_id)
                    allowed = speaks_for is not None and speaks_for in COMMAND_ROLES[kind]
                    assert outcome.accepted == allowed, (where, outcome.reason)
                    if speaks_for is None:
                        assert "predates roles" in outcome.reason, where
                    elif not allowed:
                        assert f"the {speaks_for} role may not send {kind}" in outcome.reason, where
                    if done is not None:
                        checks.append((f"{where}", done, allowed))
        state = folded(settings_of("reader")).state
        assert [where for where, done, allowed in checks if done(state) != allowed] == []
        assert state.state_hash() == worker.get("/state")["hash"]  # what a reader folds is what the worker decided with

        # 2. every principal writes every record kind, and every kind of tombstone, to every state topic
        lease = AcquireLease(new_request_id(), "kept", "drill", ("t",), 1, 600_000, "k")
        setup(lease)
        forged: list[Fact | Tombstone] = [
            TableState("t", "intermediate"), JobState("j", "t", status="FAILED"), BarrierAnnounced(999_999, 1),
            BarrierCompleted("j", "t", 1, 0, 999), LeaseState("forged", "x", 1, (SourceVersion("t", 3),), 0, 2**60),
            Tombstone("table:t"), Tombstone("job:j"), Tombstone("barrier:1"), Tombstone("completion:t@1"),
            Tombstone("lease:kept"),
        ]
        expected = folded(settings_of("admin")).state
        misplaced = 0
        for user, role in PRINCIPALS.items():
            for topic in topics.state:
                for record in forged:
                    tried += 1
                    key = entity_key(record)
                    value = None if isinstance(record, Tombstone) else attempts.codec.encode(record)
                    error = attempts.write(user, topic, key, value)
                    if not may_write(role, topics, topic):
                        assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (user, topic)
                        continue
                    assert error is None, (user, topic, key)
                    if placement_problem(topics.state_kind(topic), key) is None:
                        expected = fold(expected, record)
                    else:
                        misplaced += 1
        reader = folded(settings_of("reader"))
        got, want = reader.state.canonical(), expected.canonical()
        assert {k: v for k, v in got.items() if k != "barriers"} == {k: v for k, v in want.items() if k != "barriers"}
        assert (999_999 in reader.state.barriers) == (999_999 in expected.barriers)
        assert reader.stats.invalid_records == misplaced > 0
        assert tried == 425  # docs/security.md quotes the matrix's size
    finally:
        attempts.close()
        operator.close()
        worker.stop()
