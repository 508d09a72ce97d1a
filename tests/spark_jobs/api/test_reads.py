"""Consistent reads over FLIP-276's shopping topology while it runs.

Every item has a fixed unit price, so in any consistent snapshot total_price / total_amount
equals the unit price for every (user, item); a row where it does not is an anomaly
(``spark_jobs.demo.probes``, the same reads ``lockstep demo`` runs).
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from lockstep_reads import CoordinatorUnreachable, QueryError, Snapshot, SnapshotError, open_snapshot
from spark_jobs.demo.probes import FLIP_JOIN, Prober, wrong_prices
from tests.support import lockstep_in_process, run_lockstep
from tests.support.barriers import at, read_state, wait_for_barrier
from tests.support.supervising import SHOPPING, Shoppers

# 1 s barriers (the default): versions change about once a second, as in production
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.barrier_interval_ms(1000)]

# FLIP-276's lineage example: the sink tables of the jobs that read a table
FLIP_LINEAGE = ("SELECT T.table_name FROM __META_ETL_SINK AS T JOIN __META_ETL_SOURCE AS S ON T.job_id = S.job_id "
                "WHERE S.table_name = 'shopping'")
# read-committed and repeatable-read reads each (a pair takes about 0.1 s here when the versions
# did not change, a few seconds when Spark evaluates the join at new versions)
READS = int(os.environ.get("LOCKSTEP_TEST_READS", "1000"))



def test_consistent_reads_while_the_pipeline_runs(
    spark: SparkSession, run_pipeline: Callable[[str], Settings], make_topic: Callable, kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    topic = make_topic(partitions=1)
    settings = run_pipeline(SHOPPING.format(topic=topic))
    shoppers = Shoppers(kafka_bootstrap, topic)
    shoppers.buy(50)
    wait_for_barrier(settings, ["user_item_amount", "user_item_price"], {0: 50}, topic)
    shoppers.start()
    try:
        # thousands of reads while writers commit; Spark evaluates the join once per set of versions
        prober = Prober(spark, settings, memo=True)
        deadline = time.monotonic() + 120 + 0.5 * READS
        # the reads must also span many barriers: on a slow machine 1000 memoised reads can end
        # within a few barriers, so keep reading (within the deadline) until they span 11
        while (min(prober.stats[level].reads for level in ("read-committed", "repeatable-read")) < READS
               or len(prober.stats["read-committed"].barriers) <= 10):
            assert time.monotonic() < deadline, ({level: s.reads for level, s in prober.stats.items()},
                                                 prober.stats["read-committed"].barriers)
            prober.read("read-committed")
            prober.read("repeatable-read")
            if prober.stats["read-committed"].reads % 50 == 0:
                prober.read("read-uncommitted")
        stats = prober.stats
        light = Prober(None, settings)  # the same reads without Spark (lockstep_reads), against the same writers
        for _ in range(20):
            for level in ("read-committed", "repeatable-read", "read-uncommitted"):
                light.read(level)
        assert all(light.stats[level].reads == 20 and light.stats[level].anomalous_reads == 0
                   for level in ("read-committed", "repeatable-read")), light.stats
        # repeatable read: the same answer while writers move on; its lease is visible, then gone
        with open_snapshot(["user_item_amount", "user_item_price"], "repeatable-read", settings=settings, spark=spark) as snap:
            first = sorted(tuple(r) for r in snap.sql(FLIP_JOIN).collect())
            lease = read_state(settings).leases[snap.lease_id]
            assert lease.barrier == snap.barrier
            assert {v.table: v.version for v in lease.versions} == snap.versions
            wait_for_barrier(settings, ["user_item_amount"], {0: len(shoppers.sent) + 1}, topic)
            assert sorted(tuple(r) for r in snap.sql(FLIP_JOIN).collect()) == first
            lease_id = snap.lease_id
        assert lease_id not in read_state(settings).leases
    finally:
        shoppers.halt.set()
        shoppers.join(10)
    report = {level: (s.reads, s.anomalous_reads, s.anomalous_rows) for level, s in stats.items()}
    print(f"(reads, reads with anomalies, anomalous rows) per level: {report}; "
          f"{prober.evaluated} joins evaluated by Spark, the rest were the same versions again")
    assert stats["read-committed"].anomalous_reads == 0 and stats["repeatable-read"].anomalous_reads == 0, report
    assert stats["read-committed"].rows > 0 and stats["read-uncommitted"].reads >= READS // 50
    assert len(stats["read-committed"].barriers) > 10  # the reads really spanned many barriers
    assert 10 < prober.evaluated < stats["read-committed"].reads  # Spark ran the join for new versions only

    # as of an old barrier: equals plain Python over the records up to that barrier's cut
    state = read_state(settings)

    def cut_of(b: int) -> int:
        return next(c.offset for c in state.barriers[b].cut if c.topic == topic)

    # the oldest common exact point with the first 50 purchases in it (an earlier one may hold no
    # rows at all, and an empty snapshot cannot show the negative control's mix below)
    old = min(b for b in state.exact_points("user_item_amount")
              if b in state.exact_points("user_item_price") and cut_of(b) >= 50)
    cut = cut_of(old)
    expected: dict[tuple[int, int], int] = defaultdict(int)
    for offset, r in shoppers.sent:
        if offset < cut:
            expected[(r["user_id"], r["item_id"])] += r["amount"]
    with open_snapshot(["user_item_amount"], as_of_barrier=old, settings=settings, spark=spark) as snap:
        got = {(r["user_id"], r["item_id"]): r["total_amount"] for r in snap.table("user_item_amount").collect()}
    assert got == dict(expected)

    # negative control: the probe sees a snapshot mixed from two barriers (amounts as of the
    # oldest exact point, prices as of the newest), and none in either barrier's own pair
    newest = state.common_barrier(["user_item_amount", "user_item_price"])
    assert newest is not None and newest > old
    session = spark.newSession()  # its temporary views are its own

    def join(amounts_at: int, prices_at: int) -> int:
        at(session, settings, "user_item_amount", state.exact_points("user_item_amount")[amounts_at]) \
            .createOrReplaceTempView("user_item_amount")
        at(session, settings, "user_item_price", state.exact_points("user_item_price")[prices_at]) \
            .createOrReplaceTempView("user_item_price")
        return wrong_prices([r.asDict() for r in session.sql(FLIP_JOIN).collect()])

    assert join(old, newest) > 0 and join(newest, old) > 0
    assert join(old, old) == 0 and join(newest, newest) == 0

    # the same read from the command line: rows on stdout, barrier and versions on stderr
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LOCKSTEP_BOOTSTRAP": settings.bootstrap,
           "LOCKSTEP_WAREHOUSE": str(settings.warehouse), "LOCKSTEP_COORDINATOR_URL": settings.coordinator_url,
           "LOCKSTEP_TOPIC_PREFIX": settings.topic_prefix, "LOCKSTEP_JARS": str(settings.jars.absolute())}
    done = lockstep_in_process("query", "SELECT * FROM user_item_amount", "--as-of-barrier", str(old), "--format",
                               "csv", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert {(int(r["user_id"]), int(r["item_id"])): int(r["total_amount"]) for r in rows} == dict(expected)
    assert f"barrier {old}; versions user_item_amount={state.exact_points('user_item_amount')[old]}" in done.stderr
    through_spark = lockstep_in_process("query", "SELECT * FROM user_item_amount", "--as-of-barrier", str(old),
                                        "--format", "csv", "--engine", "spark", env=env)
    assert through_spark.returncode == 0, through_spark.stderr[-2000:]
    assert sorted(csv.DictReader(io.StringIO(through_spark.stdout)), key=str) == sorted(rows, key=str)
    bad = lockstep_in_process("query", "SELECT * FROM nope", env=env)
    assert bad.returncode == 1 and "unknown table(s): nope" in bad.stderr

    lineage = lockstep_in_process("query", FLIP_LINEAGE, "--format", "json", env=env)
    assert lineage.returncode == 0, lineage.stderr[-2000:]
    assert sorted(json.loads(line)["table_name"] for line in lineage.stdout.splitlines()) == ["user_item_amount",
                                                                                             "user_item_price"]
    with open_snapshot(["user_item_amount"], settings=settings, spark=spark) as snap:
        assert {r["table_name"] for r in snap.sql(FLIP_LINEAGE).collect()} == {"user_item_amount", "user_item_price"}
        kept = snap.sql("SELECT barrier, version FROM __meta_table_version WHERE table_name = 'user_item_amount'")
        assert state.exact_points("user_item_amount").items() <= {(r["barrier"], r["version"]) for r in kept.collect()}

    figures = run_lockstep("delays", "--format", "json", env=env, timeout=60)
    assert figures.returncode == 0, figures.stderr
    report = json.loads(figures.stdout)
    assert report["tables"]["user_item_amount"]["e2e_p50_ms"] > 0
    assert report["bottleneck"] in {"ingest_shopping", "maintain_user_item_amount", "maintain_user_item_price"}
    table_view = run_lockstep("delays", env=env, timeout=60)
    assert "bottleneck" in table_view.stdout and "user_item_price" in table_view.stdout

    with pytest.raises(SnapshotError, match="unknown table"):
        open_snapshot(["nope"], settings=settings, spark=spark)
    with pytest.raises(SnapshotError, match="no exact point at barrier"):
        open_snapshot(["user_item_amount"], as_of_barrier=10**9, settings=settings, spark=spark)
    with pytest.raises(CoordinatorUnreachable, match="127.0.0.1:9"):
        open_snapshot(["user_item_amount"], settings=Settings(coordinator_url="http://127.0.0.1:9"), spark=spark)
    with pytest.raises(QueryError, match="nope"):  # Spark's analysis error, as the light path's: one error family
        with open_snapshot(["user_item_amount"], settings=settings, spark=spark) as snap:
            snap.sql("SELECT nope FROM user_item_amount")

    # the old Spark-only names stay one release, warn, and are the one snapshot
    import spark_jobs.api
    with pytest.warns(DeprecationWarning, match=r"use lockstep_reads.open_snapshot\(tables, ..., spark=spark\)"):
        old = spark_jobs.api.open_snapshot(spark, ["user_item_amount"], settings=settings)
    with pytest.warns(DeprecationWarning, match="lockstep_reads.Snapshot"):
        assert isinstance(old, spark_jobs.api.ConsistentSnapshot) and isinstance(old, Snapshot)
    with old:
        assert old.table("user_item_amount").count() == old.sql("SELECT * FROM user_item_amount").count()


def test_a_lapsed_repeatable_read_lease_makes_the_next_read_fail_clearly(
    spark: SparkSession, make_worker: Callable, lockstep_cli: Callable, coordinator_env: dict[str, str],
) -> None:
    from coordinator.client.topics import Topics
    from coordinator.codec import default_codec
    from coordinator.domain import BarrierCompleted, entity_key

    worker = make_worker()
    settings = Settings.from_env(worker.env)
    spark.range(3).write.format("delta").save(settings.table_location("t"))
    assert lockstep_cli("emit", "declare-table", "t", "--kind", "root").returncode == 0
    assert lockstep_cli("emit", "register-job", "j", "--sink", "t", "--topics", "src").returncode == 0
    completion = BarrierCompleted("j", "t", 1, 0, 0, committed_at_ms=1)
    producer = Producer(settings.kafka_config())
    producer.produce(Topics(settings.topic_prefix).completions, key=entity_key(completion).encode(),
                     value=default_codec().encode(completion))
    producer.flush(10)
    deadline = time.monotonic() + 30
    while worker.get("/tables/t")["exact_points"] != {"1": 0}:
        assert time.monotonic() < deadline, "the exact point of t"
        time.sleep(0.2)

    snapshot = open_snapshot(["t"], consistency="repeatable-read", settings=settings, lease_ttl_ms=3000, spark=spark)
    try:
        time.sleep(4)  # renewed past its ttl
        assert snapshot.table("t").count() == 3
        worker.kill9()  # renewals fail from now on; vacuum may run once the lease expires
        time.sleep(4)
        with pytest.raises(SnapshotError, match=r"lease rr-\w+ on barrier 1 lapsed .*its renewals failed.*open a new"):
            snapshot.table("t")
    finally:
        snapshot.close()  # the coordinator is gone: the lease expires by itself, close does not hang
