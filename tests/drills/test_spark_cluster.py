"""The unchanged shopping pipeline on a Spark standalone cluster (a master and two workers from
the pyspark wheel, as ``lockstep dev up --spark-workers 2`` starts them): ``lockstep run
--master spark://...`` runs the jobs, whose Spark work the cluster's executors do, and reads at
read-committed see no anomaly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from lockstep.dev.service import free_port
from lockstep.dev.spark import LocalSparkCluster
from spark_jobs.demo.probes import TABLES, Prober
from tests.support import ROOT, wait_until
from tests.support.barriers import wait_for_barrier
from tests.support.supervising import SHOPPING, Shoppers

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.barrier_interval_ms(1000)]


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[LocalSparkCluster]:
    cluster = LocalSparkCluster(tmp_path / "spark", port=free_port(), workers=2, cores=1, memory="1g")
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


def applications(cluster: LocalSparkCluster) -> list[dict[str, object]]:
    """The running applications the master knows, from its JSON status page."""
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.master.web_port}/json/", timeout=5) as answer:
        return list(json.loads(answer.read()).get("activeapps", []))


def test_the_shopping_pipeline_runs_on_a_spark_cluster_and_reads_stay_consistent(
    spark_cluster: LocalSparkCluster, spark: SparkSession, make_worker: Callable, coordinator_env: dict[str, str],
    make_topic: Callable, kafka_bootstrap: str, tmp_path: Path,
) -> None:
    topic = make_topic(partitions=1)
    worker = make_worker()
    env = {**worker.env, "LOCKSTEP_WAREHOUSE": str(tmp_path / "wh"), "PYSPARK_PYTHON": sys.executable}
    settings = Settings.from_env(env)
    pipeline = tmp_path / "shopping.sql"
    pipeline.write_text(SHOPPING.format(topic=topic))
    log = tmp_path / "run.log"
    with open(log, "ab") as out:
        run = subprocess.Popen([sys.executable, "-m", "lockstep", "run", str(pipeline), "--master", spark_cluster.master_url,
                                "--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2"],
                               env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    shoppers = Shoppers(kafka_bootstrap, topic)
    try:
        shoppers.buy(60)
        try:
            wait_for_barrier(settings, list(TABLES), {0: len(shoppers.sent)}, topic, timeout=400)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{log.read_text()[-3000:]}") from None
        apps = applications(spark_cluster)
        assert [a["name"] for a in apps] == ["lockstep-shopping"], apps  # the jobs run on the cluster
        assert all(a.get("cores", 0) >= 1 for a in apps), apps
        # no REST submission server: it would listen on 6066, the coordinator's default port
        assert "REST server" not in spark_cluster.master.log_file.read_text()
        shoppers.start()
        prober = Prober(spark, settings, memo=True)
        wait_until(lambda: prober.read("read-committed") and len(prober.stats["read-committed"].barriers) >= 4,
                   "read-committed reads over four barriers of the cluster's jobs", 300)
    finally:
        shoppers.halt.set()
        shoppers.join(10)
        run.send_signal(signal.SIGINT)
        try:
            run.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
    stats = prober.stats["read-committed"]
    print(f"{stats.reads} read-committed reads over barriers {sorted(stats.barriers)}, "
          f"{stats.anomalous_reads} anomalous; jobs on {spark_cluster.master_url}")
    assert stats.anomalous_reads == 0 and stats.rows > 0
    assert run.returncode == 130, log.read_text()[-3000:]  # stopped by Ctrl-C, cleanly

