"""Which Spark standalone cluster ``lockstep dev`` manages (the cluster itself runs in
tests/drills/test_spark_cluster.py)."""

from __future__ import annotations

from pathlib import Path

from coordinator.settings import Settings
from lockstep.dev.spark import LocalSparkCluster, spark_home


def test_the_managed_spark_cluster_follows_the_settings(tmp_path: Path) -> None:
    cluster = LocalSparkCluster.for_settings(Settings(home=tmp_path, spark_master="spark://127.0.0.1:7177"), 2)
    assert cluster is not None and cluster.master_url == "spark://127.0.0.1:7177" and cluster.workers == 2
    assert LocalSparkCluster.for_settings(Settings(home=tmp_path), 1).port == 7077  # local[2]: the default port
    assert LocalSparkCluster.for_settings(Settings(home=tmp_path)) is None  # none started here yet
    ports = {cluster.master.web_port, *(cluster.worker(n).port for n in (1, 2)), *(cluster.worker(n).web_port for n in (1, 2))}
    assert len(ports) == 5 and 7177 not in ports  # every daemon its own ports, chosen once
    again = LocalSparkCluster.for_settings(Settings(home=tmp_path, spark_master="spark://127.0.0.1:7177"))
    assert again is not None and again.workers == 2 and again.worker(2).web_port == cluster.worker(2).web_port
    assert (spark_home() / "bin" / "spark-class").exists()  # the wheel carries what starts the daemons
