"""The coordinator app (coordinator/stream/app.py): built from the Settings it is given, and run as a
real worker process on a real broker: commands, replay, restarts, failover."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from coordinator.client.rest import get_json
from coordinator.client.state import read_state
from coordinator.client.topics import Topics
from coordinator.codec import default_codec
from coordinator.domain import (
    AcquireLease,
    BarrierAnnounced,
    BarrierCompleted,
    CutEntry,
    DeclareTable,
    JobState,
    LeaseState,
    RegisterJob,
    SourceVersion,
    TableState,
    Tombstone,
    entity_key,
)
from coordinator.domain.events import OffsetRange
from coordinator.settings import Settings
from coordinator.stream.app import create_app
from tests.support import ROOT, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_importing_the_app_reads_no_environment_and_touches_no_disk(tmp_path: Path) -> None:
    env = {**os.environ, "LOCKSTEP_HOME": str(tmp_path), "LOCKSTEP_COORDINATOR_URL": "not a url"}
    done = subprocess.run([sys.executable, "-c", "import coordinator.stream.app"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_app_follows_the_settings_it_is_given(tmp_path: Path) -> None:
    app = create_app(Settings(home=tmp_path, coordinator_url="http://127.0.0.1:6123", topic_prefix="t1"))
    assert app.conf.id == "t1-coordinator"
    assert (app.conf.web_host, app.conf.web_port) == ("127.0.0.1", 6123)
    assert Path(app.conf.datadir).parent == tmp_path.absolute() / "coordinator"
    assert {"/health", "/state", "/snapshot", "/delays", "/metrics"} <= {route for route in app.web.views}


def test_emit_prints_outcomes_with_exit_codes(make_worker: Callable, lockstep_cli: Callable) -> None:
    worker = make_worker()
    ok = lockstep_cli("emit", "declare-table", "shopping", "--kind", "root", "--primary-key", "user_id,item_id")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "accepted: DeclareTable" in ok.stdout and "table:shopping" in ok.stdout
    again = lockstep_cli("emit", "declare-table", "shopping", "--kind", "root", "--primary-key", "user_id,item_id")
    assert again.returncode == 0 and "no change" in again.stdout

    bad = lockstep_cli("emit", "register-job", "j", "--sink", "missing", "--topics", "src")
    assert bad.returncode == 1
    assert "rejected: RegisterJob" in bad.stderr and "unknown table 'missing'" in bad.stderr

    assert lockstep_cli("emit", "register-job", "ingest", "--sink", "shopping", "--topics", "src").returncode == 0
    second = lockstep_cli("emit", "register-job", "ingest2", "--sink", "shopping", "--topics", "src")
    assert second.returncode == 1 and "already has a writer: job 'ingest'" in second.stderr

    topology = worker.get("/topology")
    assert topology["tables"]["shopping"]["writer"] == "ingest"
    assert topology["jobs"]["ingest"]["external_topics"] == ["src"]
    shown = lockstep_cli("topology", "--format", "json", url=worker.url)
    assert shown.returncode == 0 and '"ingest"' in shown.stdout
    dot = lockstep_cli("topology", "--format", "dot", url=worker.url)
    assert '"kafka:src" -> "shopping" [label="ingest"];' in dot.stdout

    tail = lockstep_cli("barriers", "tail", "--from-beginning", "--count", "3", timeout=60)
    assert tail.returncode == 0
    assert [line.split()[:2] for line in tail.stdout.splitlines()] == [["barrier", "1"], ["barrier", "2"], ["barrier", "3"]]


def test_emit_without_a_coordinator_exits_3(lockstep_cli: Callable) -> None:
    result = lockstep_cli("emit", "--timeout", "3", "declare-table", "t", "--kind", "root")
    assert result.returncode == 3
    assert "lockstep worker" in result.stderr


def test_barrier_cut_covers_external_topics_and_metrics_show_the_backlog(
    make_worker: Callable, lockstep_cli: Callable, make_topic: Callable, kafka_bootstrap: str,
    coordinator_env: dict[str, str],
) -> None:
    source = make_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(10):
        producer.produce(source, partition=i % 2, value=b"x")
    producer.flush(10)
    worker = make_worker()
    assert lockstep_cli("emit", "declare-table", "t", "--kind", "root").returncode == 0
    assert lockstep_cli("emit", "register-job", "j", "--sink", "t", "--topics", source).returncode == 0
    barrier = wait_until(lambda: next((b for b in worker.get("/barriers?limit=100000") if b["cut"]), None), "a cut", timeout=30)
    assert sorted((c["topic"], c["partition"], c["offset"]) for c in barrier["cut"]) == [(source, 0, 5), (source, 1, 5)]
    # the job has read nothing yet: the whole topic is its backlog; once its completion of the
    # barrier is in, only what came after the cut
    wait_until(lambda: worker.metric("lockstep_kafka_backlog_records", table="t") == 10, "a backlog of 10", timeout=30)
    settings = Settings.from_env(coordinator_env)
    done = BarrierCompleted("j", "t", barrier["barrier"], 0, 1, rows_in=10, committed_at_ms=barrier["ts_ms"] + 100,
                            source_offsets=(OffsetRange(source, 0, 0, 5), OffsetRange(source, 1, 0, 5)))
    publisher = Producer(settings.kafka_config())
    publisher.produce(Topics(settings.topic_prefix).completions, key=entity_key(done).encode(),
                      value=default_codec().encode(done))
    for _ in range(3):
        publisher.produce(source, partition=0, value=b"y")
    assert publisher.flush(10) == 0
    wait_until(lambda: worker.metric("lockstep_kafka_backlog_records", table="t") == 3, "a backlog of 3", timeout=30)


def test_a_completion_erased_by_a_tombstone_the_coordinator_did_not_write_is_written_back(
    make_worker: Callable, lockstep_cli: Callable, coordinator_env: dict[str, str],
) -> None:
    worker = make_worker()
    assert lockstep_cli("emit", "declare-table", "t", "--kind", "root").returncode == 0
    assert lockstep_cli("emit", "register-job", "j", "--sink", "t", "--topics", "src").returncode == 0
    b = wait_until(lambda: max(worker.barrier_ids(), default=0), "a barrier", timeout=30)
    settings = Settings.from_env(coordinator_env)
    completions = Topics(settings.topic_prefix).completions
    done = BarrierCompleted("j", "t", b, 0, 7, committed_at_ms=1)
    forger = Producer(settings.kafka_config())  # a job principal may write the completions topic
    forger.produce(completions, key=entity_key(done).encode(), value=default_codec().encode(done))
    assert forger.flush(10) == 0
    wait_until(lambda: read_state(settings).exact_points("t") == {b: 7}, "the exact point", timeout=30)
    forger.produce(completions, key=entity_key(done).encode(), value=None)
    assert forger.flush(10) == 0
    wait_until(lambda: worker.metric("lockstep_completions_restored_total") == 1, "written back", timeout=30)
    assert read_state(settings).exact_points("t") == {b: 7}  # also after compaction: the last record is the value
    assert last_value(settings, completions, entity_key(done)) == default_codec().encode(done)
    # the coordinator's own tombstones are not written back: a drop takes its completions with it
    assert lockstep_cli("emit", "deregister-job", "j", "--status", "FINISHED").returncode == 0
    assert lockstep_cli("emit", "drop-table", "t").returncode == 0
    wait_until(lambda: "t" not in read_state(settings).completions, "the drop", timeout=30)
    time.sleep(2)  # four of the leader's looks
    assert worker.metric("lockstep_completions_restored_total") == 1 and "t" not in read_state(settings).completions


def last_value(settings: Settings, topic: str, key: str) -> bytes | None:
    """The value of the newest committed record under ``key`` in partition 0 of ``topic``
    (what compaction keeps); the leader writes in transactions, so a commit marker may end it."""
    consumer = Consumer(settings.kafka_config({"group.id": f"last-{time.time_ns()}", "isolation.level": "read_committed",
                                               "enable.auto.commit": False}))
    try:
        partition = TopicPartition(topic, 0, OFFSET_BEGINNING)
        high = consumer.get_watermark_offsets(partition, timeout=10)[1]
        consumer.assign([partition])
        values: list[bytes | None] = []
        deadline = time.monotonic() + 30
        while consumer.position([partition])[0].offset < high and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None and msg.key() == key.encode():
                values.append(msg.value())
        return values[-1] if values else None
    finally:
        consumer.close()


def test_ten_thousand_mixed_events_then_replay_verify(
    make_worker: Callable, lockstep_cli: Callable, coordinator_env: dict[str, str], kafka_bootstrap: str
) -> None:
    worker = make_worker()
    for name, kind in [("shopping", "root"), ("amount", "intermediate"), ("price", "intermediate")]:
        assert lockstep_cli("emit", "declare-table", name, "--kind", kind).returncode == 0
    assert lockstep_cli("emit", "register-job", "ingest", "--sink", "shopping", "--topics", "src").returncode == 0
    assert lockstep_cli("emit", "register-job", "amount_job", "--sink", "amount", "--sources", "shopping").returncode == 0

    topics = Topics(coordinator_env["LOCKSTEP_TOPIC_PREFIX"])
    codec = default_codec()
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 20})
    rng = random.Random(3)
    garbage = 0
    for i in range(10_000):
        roll = rng.random()
        if roll < 0.85:
            fact: Any = BarrierCompleted("ingest", rng.choice(["shopping", "amount", "ghost"]), rng.randint(1, 400), 0,
                                         rng.randint(0, 50), rows_in=rng.randint(0, 9), committed_at_ms=i)
            producer.produce(topics.completions, key=entity_key(fact).encode(), value=codec.encode(fact))
        elif roll < 0.93:
            fact = LeaseState(f"l{rng.randint(0, 30)}", "reader", 1, (SourceVersion("shopping", 1),), i, 2**62)
            producer.produce(topics.leases, key=entity_key(fact).encode(), value=codec.encode(fact))
        elif roll < 0.98:
            tomb = Tombstone(f"completion:shopping@{rng.randint(1, 400)}")
            producer.produce(topics.completions, key=tomb.key.encode(), value=None)
        else:
            garbage += 1
            producer.produce(topics.completions, key=b"completion:x@1", value=os.urandom(rng.randint(0, 40)))
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0

    result = lockstep_cli("replay", "--verify", url=worker.url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verified: identical to the live coordinator" in result.stdout
    as_json = json.loads(lockstep_cli("replay", "--verify", "--format", "json", url=worker.url).stdout)
    assert as_json["verified"] is True and as_json["decode_errors"] == garbage and len(as_json["state_hash"]) == 64
    assert worker.metric("lockstep_decode_errors_total") == garbage, "undecodable records are counted, not fatal"
    assert worker.get("/health")["status"] == "ok"


def test_metrics_count_rows_and_delays_per_table_and_freshness_grows_while_nothing_commits(
    make_worker: Callable, lockstep_cli: Callable, coordinator_env: dict[str, str]
) -> None:
    worker = make_worker()
    assert lockstep_cli("emit", "declare-table", "t", "--kind", "root", url=worker.url).returncode == 0
    wait_until(lambda: len(worker.barrier_ids()) >= 2, "barriers", timeout=30)
    announced = {b["barrier"]: b["ts_ms"] for b in worker.get("/barriers?limit=100000")}
    b = max(announced)
    # a completion counts only from the table's writer
    assert lockstep_cli("emit", "register-job", "ingest_t", "--sink", "t", "--topics", "x", url=worker.url).returncode == 0
    settings = Settings.from_env(coordinator_env)
    fact = BarrierCompleted("ingest_t", "t", b, 0, 1, rows_in=7, rows_out=5, rows_rejected=2,
                            started_at_ms=announced[b] + 100, committed_at_ms=announced[b] + 400)
    producer = Producer(settings.kafka_config())
    for _ in range(2):  # published again, as after a job's restart: counted once
        producer.produce(Topics(settings.topic_prefix).completions, key=entity_key(fact).encode(),
                         value=default_codec().encode(fact))
    assert producer.flush(10) == 0
    wait_until(lambda: worker.metric("lockstep_rows_in_total", table="t") == 7, "the completion counted", timeout=30)
    assert worker.metric("lockstep_rows_rejected_total", table="t") == 2
    assert worker.metric("lockstep_rows_committed_total", table="t") == 5
    assert worker.metric("lockstep_e2e_delay_seconds_count", table="t") == 1  # seconds, a histogram
    assert worker.metric("lockstep_e2e_delay_seconds_bucket", table="t", le="0.25") == 0
    assert worker.metric("lockstep_e2e_delay_seconds_bucket", table="t", le="0.5") == 1
    assert worker.metric("lockstep_job_barrier_seconds_sum", job="ingest_t") == pytest.approx(0.3)
    first = worker.metric("lockstep_table_freshness_seconds", table="t")
    assert first is not None
    time.sleep(1.5)
    fresh = worker.metric("lockstep_table_freshness_seconds", table="t")
    assert fresh is not None and fresh >= first + 1  # nothing commits: the table grows staler, visibly
    lag = worker.metric("lockstep_barrier_lag", table="t")
    assert lag is not None and lag >= 1


def test_ctrl_c_stops_a_worker_with_exit_130(make_worker: Callable) -> None:
    worker = make_worker()
    assert worker.proc is not None
    worker.proc.send_signal(signal.SIGINT)  # Faust alone would exit 0
    assert worker.proc.wait(60) == 130


def test_kill9_and_restart_keeps_state_and_barrier_ids_continue(
    make_worker: Callable, lockstep_cli: Callable, coordinator_env: dict[str, str]
) -> None:
    worker = make_worker()
    assert lockstep_cli("emit", "declare-table", "t", "--kind", "root").returncode == 0
    assert lockstep_cli("emit", "register-job", "j", "--sink", "t", "--topics", "src").returncode == 0
    # no time is claimed here (the failover test claims one): a busy machine's new worker took over 30 s
    wait_until(lambda: len(worker.barrier_ids()) >= 5, "five barriers", timeout=90)
    worker.kill9()
    before_state = worker_state_from_replay(coordinator_env)

    restarted = make_worker(start=False)
    restarted.port = worker.port
    restarted.start()
    ids = wait_until(lambda: (ids := restarted.barrier_ids()) and len(ids) >= len(before_state["barriers"]) + 3 and ids,
                     "new barriers after the restart", timeout=90)
    assert ids == list(range(1, len(ids) + 1)), "barrier ids continue with no gap and no duplicate"
    after = restarted.get("/state")["state"]
    for section in ("tables", "jobs", "leases", "completions"):
        assert after[section] == before_state[section], section
    assert all(after["barriers"][b] == barrier for b, barrier in before_state["barriers"].items())
    verify = lockstep_cli("replay", "--verify", url=restarted.url)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_the_leader_forgets_old_barriers_and_ids_continue_after_a_restart(
    make_worker: Callable, lockstep_cli: Callable, coordinator_env: dict[str, str]
) -> None:
    coordinator_env["LOCKSTEP_RETAIN_BARRIERS"] = "10"  # barriers every 200 ms: pruned every 5 s
    worker = make_worker()
    ids = wait_until(lambda: (ids := worker.barrier_ids()) and ids[0] > 20 and ids, "the oldest barriers pruned", timeout=60)
    assert ids == list(range(ids[0], ids[0] + len(ids))) and len(ids) <= 10 + 40  # newest kept, a few seconds' worth
    assert worker.metric("lockstep_records_pruned_total") > 0
    verify = lockstep_cli("replay", "--verify", url=worker.url)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    worker.kill9()
    restarted = make_worker(start=False)
    restarted.port = worker.port
    restarted.start()
    after = wait_until(lambda: (now := restarted.barrier_ids()) and now[-1] > ids[-1] + 3 and now, "barriers after the restart",
                       timeout=60)
    assert after == list(range(after[0], after[0] + len(after))), "ids continue with no gap and no duplicate"


def test_a_ctas_table_whose_runner_died_is_dropped_by_the_leader(
    make_worker: Callable, lockstep_cli: Callable, coordinator_env: dict[str, str]
) -> None:
    from coordinator.client.commands import CommandClient, new_request_id

    coordinator_env["LOCKSTEP_JOB_LIVENESS_MS"] = "1000"  # silent for 2 s: gone
    worker = make_worker()
    client = CommandClient(Settings.from_env({**coordinator_env, "LOCKSTEP_COORDINATOR_URL": worker.url}))
    try:
        for command in (DeclareTable(new_request_id(), "src", "root"),
                        DeclareTable(new_request_id(), "totals", "intermediate", ctas=True),
                        RegisterJob(new_request_id(), "maintain_totals", "totals", sources=("src",))):
            assert client.emit(command).accepted
    finally:
        client.close()
    assert worker.get("/topology")["pending"] == ["totals"]  # no runner ever commits its first barrier
    wait_until(lambda: worker.get("/topology")["pending"] == [], "the abandoned table dropped", timeout=30)
    job = worker.get("/state")["state"]["jobs"]["maintain_totals"]
    assert job["status"] == "FAILED" and "before the first commit of totals" in job["reason"]
    # counted once the leader's write is folded, a moment after the table left the state
    wait_until(lambda: worker.metric("lockstep_ctas_abandoned_total") == 1, "the count", timeout=10)


def test_drop_removes_a_table_with_data_and_its_files_unless_a_job_reads_it(
    make_worker: Callable, lockstep_cli: Callable, coordinator_env: dict[str, str], kafka_bootstrap: str
) -> None:
    worker = make_worker()
    settings = Settings.from_env({**coordinator_env, "LOCKSTEP_COORDINATOR_URL": worker.url})
    for args in (("declare-table", "t", "--kind", "root"), ("declare-table", "u", "--kind", "intermediate"),
                 ("register-job", "j", "--sink", "t", "--topics", "src"),
                 ("register-job", "k", "--sink", "u", "--sources", "t")):
        assert lockstep_cli("emit", *args).returncode == 0
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    fact = BarrierCompleted("j", "t", 1, 0, 0, committed_at_ms=1)
    producer.produce(Topics(settings.topic_prefix).completions, key=entity_key(fact).encode(), value=default_codec().encode(fact))
    producer.flush(10)
    wait_until(lambda: worker.get("/tables/t").get("latest_exact_barrier") == 1, "t's exact point", timeout=30)
    table_id = worker.get("/topology")["tables"]["t"]["table_id"]
    files = [Path(settings.table_location("t")) / "part-0.parquet", Path(settings.table_location("t__dlq")) / "part-0.parquet",
             settings.checkpoints / settings.topic_prefix / f"t-{table_id}" / "j" / "offsets" / "0",
             settings.home / "checkpoints" / "j" / "offsets" / "0"]  # where an older Lockstep kept it
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")

    refused = lockstep_cli("drop", "t", url=worker.url)
    assert refused.returncode == 1 and "written by running job 'j'" in refused.stderr
    assert lockstep_cli("stop", "j", url=worker.url).returncode == 0
    refused = lockstep_cli("drop", "t", url=worker.url)
    assert refused.returncode == 1 and "read by running job(s) k" in refused.stderr
    assert all(path.exists() for path in files)  # a refused drop touches nothing
    assert lockstep_cli("stop", "k", "--cancel", url=worker.url).returncode == 0
    dropped = lockstep_cli("drop", "t", "--reason", "replaced", url=worker.url)
    assert dropped.returncode == 0, dropped.stderr
    assert not any(path.exists() for path in files) and "table t dropped" in dropped.stdout
    state = worker.get("/state")["state"]
    assert "t" not in state["tables"] and not any(key.startswith("t@") for key in state["completions"])
    assert state["jobs"]["j"]["status"] == "FINISHED"  # the job that wrote it stays on record


def worker_state_from_replay(env: dict[str, str]) -> dict[str, Any]:
    from coordinator.client.state import StateReader

    reader = StateReader(Settings.from_env(env), Topics(env["LOCKSTEP_TOPIC_PREFIX"]))
    try:
        return reader.read_to_end().canonical()
    finally:
        reader.close()


def test_failover_to_the_second_worker_within_30s(make_worker: Callable) -> None:
    first, second = make_worker(), make_worker()
    leader, standby = wait_until(
        lambda: next(((a, b) for a, b in [(first, second), (second, first)] if a.get("/health")["leader"]), None),
        "a leader", timeout=30,
    )
    wait_until(lambda: len(standby.barrier_ids()) >= 3, "barriers seen by the standby", timeout=30)
    last_before = max(standby.barrier_ids())
    both = Settings(coordinator_url=f"{leader.url},{standby.url}")  # a client that knows both workers
    assert get_json(both, "/health")["leader"]
    leader.kill9()
    killed_at = time.monotonic()
    assert get_json(both, "/health")["status"] == "ok"  # the standby answers at once
    wait_until(lambda: max(standby.barrier_ids()) > last_before + 2, "the standby announcing barriers", timeout=45)
    took = time.monotonic() - killed_at
    assert took <= 30, f"failover took {took:.1f}s"
    ids = standby.barrier_ids()
    assert ids == list(range(1, len(ids) + 1))
    assert get_json(both, "/barriers?limit=100000")[-1]["barrier"] >= ids[-1]


def test_lease_over_http_snapshot_and_expiry(
    make_worker: Callable, lockstep_cli: Callable, coordinator_env: dict[str, str], kafka_bootstrap: str
) -> None:
    worker = make_worker()
    assert lockstep_cli("emit", "declare-table", "t", "--kind", "root").returncode == 0
    assert lockstep_cli("emit", "register-job", "j", "--sink", "t", "--topics", "src").returncode == 0
    completion = BarrierCompleted("j", "t", 1, 0, 7, committed_at_ms=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(Topics(coordinator_env["LOCKSTEP_TOPIC_PREFIX"]).completions,
                     key=entity_key(completion).encode(), value=default_codec().encode(completion))
    producer.flush(10)
    wait_until(lambda: worker.get("/tables/t")["exact_points"] == {"1": 7}, "the exact point", timeout=10)

    announced = worker.get("/barriers?from=1&limit=1")[0]["ts_ms"]
    where = {"t": f"{coordinator_env['LOCKSTEP_WAREHOUSE']}/t"}  # so that any engine can read the versions
    expected = {"barrier": 1, "versions": {"t": 7}, "data_ts_ms": announced, "locations": where}
    assert worker.get("/snapshot?tables=t&as_of_barrier=1") == expected
    assert worker.get("/snapshot?tables=t") == expected
    assert "unknown table(s): nope" in worker.get("/snapshot?tables=nope")["error"]
    assert worker.get("/delays")["tables"]["t"]["latest_exact_barrier"] == 1
    assert worker.get(f"/delays?since_ms={announced}")["tables"]["t"]["e2e_p50_ms"] is not None
    assert worker.get(f"/delays?since_ms={announced + 1}")["tables"]["t"]["e2e_p50_ms"] is None  # before the window
    assert "must be a whole number" in worker.get("/delays?last=x")["error"]

    lease = lockstep_cli("emit", "acquire-lease", "l1", "--holder", "me", "--tables", "t", "--barrier", "1", "--ttl-ms", "1500")
    assert lease.returncode == 0, lease.stdout + lease.stderr
    held = worker.get("/state")["state"]["leases"]["l1"]
    assert held["versions"] == [{"table": "t", "version": 7}]
    wait_until(lambda: "l1" not in worker.get("/state")["state"]["leases"], "the lease to expire", timeout=15)
    gone = lockstep_cli("emit", "release-lease", "l1")
    assert gone.returncode == 1 and "unknown lease 'l1'" in gone.stderr


def test_poisoned_state_records_are_skipped_counted_and_survive_a_restart(
    make_worker: Callable, coordinator_env: dict[str, str], kafka_bootstrap: str
) -> None:
    worker = make_worker()
    wait_until(lambda: len(worker.barrier_ids()) >= 3, "barriers", timeout=30)
    topics, codec = Topics(coordinator_env["LOCKSTEP_TOPIC_PREFIX"]), default_codec()
    poison = [(topics.barriers, BarrierAnnounced(2**63 - 1, 0)), (topics.registry, TableState("../../x", "root")),
              (topics.registry, TableState("x__dlq", "root"))]
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for topic, record in poison:
        producer.produce(topic, key=entity_key(record).encode(), value=codec.encode(record))
    producer.produce(topics.registry, key=b"table:y", value=b"\x00not avro")
    producer.flush(10)
    wait_until(lambda: worker.metric("lockstep_invalid_records_total") == 3, "the invalid records counted", timeout=30)
    assert worker.metric("lockstep_decode_errors_total") == 1
    before = worker.barrier_ids()[-1]
    wait_until(lambda: worker.barrier_ids()[-1] > before + 3, "barriers after the poison", timeout=30)
    assert max(worker.barrier_ids()) < 2**62 and worker.get("/state")["state"]["tables"] == {}

    worker.kill9()  # the poison is the newest value of its keys: a restart reads it first thing
    restarted = make_worker(start=False)
    restarted.port = worker.port
    restarted.start()
    ids = wait_until(lambda: (ids := restarted.barrier_ids()) and ids[-1] > before + 10 and ids, "barriers after a restart",
                     timeout=60)
    assert ids == list(range(ids[0], ids[-1] + 1))


def poisoned_records(topics: Topics, count: int, seed: int = 16) -> Iterator[tuple[str, bytes, bytes | None]]:
    """``count`` random and mutated records for every topic a worker reads: valid events of
    every kind with forged names, ids out of range and unknown writers, then the same with
    flipped bytes, truncated, under another entity's key, or replaced by random bytes."""
    rng, codec = random.Random(seed), default_codec()
    names = ["shopping", "../../x", "x__dlq", "", "a" * 300, "é", "__meta_etl_sink", "ghost", "DROP TABLE t"]
    numbers = [0, 1, 7, -1, 2**53, 2**53 + 1, 2**63 - 1, -(2**63)]

    def event() -> tuple[str, Any]:
        name, other, n = rng.choice(names), rng.choice(names), rng.choice(numbers)
        command_topic = rng.choice(sorted(topics.command_topics))  # every role's, and the one before roles
        return rng.choice([
            (topics.registry, TableState(name, rng.choice(["root", "intermediate", "weird"]), ("id",))),
            (topics.registry, JobState(name, other, sources=(rng.choice(names),), status=rng.choice(["RUNNING", "??"]))),
            (topics.barriers, BarrierAnnounced(n, n, (CutEntry(name, 0, n),))),
            (topics.completions, BarrierCompleted(name, other, n, n, n, committed_at_ms=n)),
            (topics.leases, LeaseState(name, "reader", n, (SourceVersion(other, n),), 0, n)),
            (topics.completions, TableState(name, "root")),  # a state record on another kind's topic
            (command_topic, DeclareTable(f"r{rng.random()}", name, rng.choice(["root", "intermediate"]), ("id",))),
            (command_topic, RegisterJob(f"r{rng.random()}", name, other, sources=(rng.choice(names),))),
            (command_topic, AcquireLease(f"r{rng.random()}", name, "reader", (other,), n, n, rng.choice(["", name]))),
        ])

    made = 0
    while made < count:
        topic, record = event()
        try:
            value: bytes | None = codec.encode(record)
        except (ValueError, OverflowError, TypeError):  # the codec itself refuses some (e.g. ints past 64 bits)
            continue
        key = (record.request_id if hasattr(record, "request_id") else entity_key(record)).encode()
        mutation = rng.random()
        if mutation < 0.3:
            pass  # well-formed, but forged
        elif mutation < 0.55:
            flipped = bytearray(value or b"")
            for _ in range(rng.randint(1, 4)):
                at = rng.randrange(len(flipped))
                flipped[at] = rng.randrange(256)
            value = bytes(flipped)
        elif mutation < 0.7:
            value = value[: rng.randrange(len(value))]
        elif mutation < 0.8:
            key = rng.choice([b"", b"table:", b"barrier:x", b"completion:a@b", b"\xff\xfe", os.urandom(8)])
        elif mutation < 0.9:
            value = os.urandom(rng.randint(0, 64))
        else:
            value = None  # a tombstone, for any key
        made += 1
        yield topic, key, value


def test_ten_thousand_poisoned_records_on_every_topic_are_skipped_and_counted(
    make_worker: Callable, lockstep_cli: Callable, coordinator_env: dict[str, str], kafka_bootstrap: str
) -> None:
    worker = make_worker()
    wait_until(lambda: len(worker.barrier_ids()) >= 3, "barriers", timeout=30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 20})
    for i, (topic, key, value) in enumerate(poisoned_records(Topics(coordinator_env["LOCKSTEP_TOPIC_PREFIX"]), 10_000)):
        producer.produce(topic, key=key, value=value)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0

    # the worker is still there, answers, decides a real command, and announces barriers
    ok = wait_until(lambda: (r := lockstep_cli("emit", "declare-table", "after", "--kind", "root")).returncode == 0 and r,
                    "a command decided after the poison", timeout=120)
    assert "accepted" in ok.stdout
    before = max(worker.barrier_ids())
    wait_until(lambda: max(worker.barrier_ids()) > before + 3, "barriers after the poison", timeout=60)
    assert worker.proc.poll() is None and worker.get("/health")["status"] == "ok"
    counted = {name: worker.metric(f"lockstep_{name}_total")
               for name in ("decode_errors", "invalid_records", "command_decode_errors", "commands_rejected")}
    assert all(value is not None and value > 0 for value in counted.values()), counted
    verify = lockstep_cli("replay", "--verify", url=worker.url)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def fuzzed_paths(outside: Path, rng: random.Random, count: int) -> list[str]:
    """Paths under /page/ that try to reach ``outside`` (a file beside the page folder's parents):
    encoded slashes and dots, absolute paths, backslashes, doubled encodings, NUL, long names."""
    target = str(outside).lstrip("/")
    ups = ["../", "..%2F", "%2e%2e/", "%2e%2e%2f", "..%5c", "..\\", "%252e%252e%252f", ".%2e/", "....//", "%c0%ae%c0%ae/"]
    fixed = [f"%2F{target.replace('/', '%2F')}", f"/{target}", f"//{target}", f"vendor/%2F{target.replace('/', '%2F')}",
             f"{target}%00.js", "%00", "page.js%00", "a" * 5000 + ".js", "vendor/" + "b" * 300, "%ff%fe.html",
             f"file:///{target}", "~root/.bashrc", "../app.py", "..%2Fapp.py", "vendor/../../app.py"]
    made = list(fixed)
    while len(made) < count:
        up = "".join(rng.choice(ups) for _ in range(rng.randint(1, 12)))
        made.append(rng.choice(["", "vendor/"]) + up + rng.choice([target, target.replace("/", "%2F"), "app.py",
                                                                   "stream/app.py", "etc/passwd"]))
    return made


def raw_get(port: int, path: str, host: str | None = None) -> tuple[int, bytes]:
    """GET ``path`` exactly as given (no client-side normalisation), with ``host`` as the Host header."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", f"127.0.0.1:{port}" if host is None else host)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_the_rest_api_serves_its_page_files_only_and_answers_only_its_own_host(
    make_worker: Callable, lockstep_cli: Callable, coordinator_env: dict[str, str], kafka_bootstrap: str, tmp_path: Path
) -> None:
    worker = make_worker()
    port = int(worker.url.rsplit(":", 1)[1])
    outside = tmp_path / "probe.html"
    outside.write_text("OUTSIDE-THE-PAGE-FOLDER")
    page = ROOT / "coordinator" / "stream" / "page"
    assert raw_get(port, "/page/page.js") == (200, (page / "page.js").read_bytes())
    assert raw_get(port, "/page/vendor/uPlot.iife.min.js")[0] == 200
    assert raw_get(port, "/")[0] == 200
    paths = fuzzed_paths(outside, random.Random(46), 400)
    answers = {path: raw_get(port, "/page/" + path) for path in paths}
    leaked = {p: status for p, (status, body) in answers.items()
              if b"OUTSIDE-THE-PAGE-FOLDER" in body or b"def create_app" in body or b"root:x:0:0" in body}
    assert leaked == {}
    assert {status for status, _ in answers.values()} <= {400, 403, 404}, {p: s for p, (s, _) in answers.items() if s == 200}

    for host in ("127.0.0.1", f"127.0.0.1:{port}", f"localhost:{port}"):
        assert raw_get(port, "/health", host)[0] == 200, host
    for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.nip.io:{port}", ""):
        status, body = raw_get(port, "/health", host)
        assert status == 421 and b"is not this worker's address" in body, (host, status)
        assert raw_get(port, "/page/page.js", host)[0] == 421

    # a lease's secret shows nowhere, nor its digest
    assert lockstep_cli("emit", "declare-table", "t", "--kind", "root").returncode == 0
    assert lockstep_cli("emit", "register-job", "j", "--sink", "t", "--topics", "src").returncode == 0
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    completion = BarrierCompleted("j", "t", 1, 0, 3, committed_at_ms=1)
    producer.produce(Topics(coordinator_env["LOCKSTEP_TOPIC_PREFIX"]).completions, key=entity_key(completion).encode(),
                     value=default_codec().encode(completion))
    producer.flush(10)
    wait_until(lambda: worker.get("/tables/t")["exact_points"] == {"1": 3}, "the exact point", timeout=10)
    took = lockstep_cli("emit", "acquire-lease", "l1", "--holder", "me", "--tables", "t", "--barrier", "1",
                        "--secret", "hunter2-secret")
    assert took.returncode == 0, took.stderr
    assert "hunter2-secret" not in worker.get_text("/overview") + worker.get_text("/state")
    assert "secret_digest" not in worker.get_text("/overview") + worker.get_text("/state")
    assert worker.get("/state")["state"]["leases"]["l1"]["holder"] == "me"
    assert lockstep_cli("replay", "--verify", url=worker.url).returncode == 0  # compared as /state shows it
    guessed = lockstep_cli("emit", "release-lease", "l1", "--secret", "guess")
    assert guessed.returncode == 1 and "released only by its holder" in guessed.stderr
    assert lockstep_cli("emit", "release-lease", "l1", "--secret", "hunter2-secret").returncode == 0
