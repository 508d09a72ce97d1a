"""``lockstep dev up|status|down`` against a real broker in its own home and port."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
from pathlib import Path

import pytest

from coordinator.settings import Settings
from lockstep.dev.broker import HOST, BrokerError, LocalBroker, LocalKafkaCluster, free_port, new_cluster_id, process_alive
from tests.support import ROOT, run_lockstep

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def lockstep(home: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "LOCKSTEP_HOME": str(home),
        "LOCKSTEP_JARS": str(ROOT / ".lockstep" / "jars"),
        "LOCKSTEP_BOOTSTRAP": f"{HOST}:{port}",
    }
    return run_lockstep(*args, env=env, timeout=180)


def test_up_twice_status_down_leaves_no_process(tmp_path: Path) -> None:
    port = free_port()
    first = lockstep(tmp_path, port, "dev", "up")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "started" in first.stdout
    pid = LocalBroker(tmp_path / "kafka", ROOT / ".lockstep/jars/kafka", port).running_pid()
    assert pid is not None
    try:
        second = lockstep(tmp_path, port, "dev", "up")
        assert second.returncode == 0, second.stdout + second.stderr
        assert "already running" in second.stdout and f"pid {pid}" in second.stdout

        status = lockstep(tmp_path, port, "dev", "status")
        assert status.returncode == 0
        assert f"running, pid {pid}, bootstrap {HOST}:{port}, 0 topics" in status.stdout
    finally:
        down = lockstep(tmp_path, port, "dev", "down")
    assert down.returncode == 0 and "broker stopped" in down.stdout
    assert not process_alive(pid), "the broker's java process is still alive"
    stopped = lockstep(tmp_path, port, "dev", "status")
    assert stopped.returncode == 3 and "stopped" in stopped.stdout
    assert lockstep(tmp_path, port, "dev", "down").stdout.strip() == "broker was not running"


def test_port_held_by_someone_else_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind((HOST, 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = lockstep(tmp_path, port, "dev", "up")
    assert result.returncode == 4  # a part Lockstep starts could not start
    assert f"port {port} on {HOST} is already in use" in result.stderr
    assert "LOCKSTEP_BOOTSTRAP" in result.stderr


def test_missing_jars_say_how_to_fix(tmp_path: Path) -> None:
    env_home = tmp_path / "home"
    env = {**os.environ, "LOCKSTEP_HOME": str(env_home), "LOCKSTEP_JARS": str(tmp_path / "nojars"),
           "LOCKSTEP_BOOTSTRAP": f"{HOST}:{free_port()}"}
    result = run_lockstep("dev", "up", env=env, timeout=60)
    assert result.returncode == 4
    assert "scripts/setup" in result.stderr


def test_the_managed_broker_follows_the_settings(tmp_path: Path) -> None:
    broker = LocalBroker.for_settings(Settings(bootstrap="127.0.0.1:19999", home=tmp_path, jars=tmp_path / "jars"))
    assert broker is not None and broker.port == 19999 and broker.home == (tmp_path / "kafka").absolute()
    assert LocalBroker.for_settings(Settings(bootstrap="kafka.example:9092")) is None


def test_cluster_ids_are_16_bytes_and_never_look_like_a_flag() -> None:
    ids = [new_cluster_id() for _ in range(2000)]  # ~30 would start with '-' without the guard
    assert all(not i.startswith("-") and len(i) == 22 for i in ids)
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)


def test_the_managed_cluster_follows_the_settings_and_keeps_its_layout(tmp_path: Path) -> None:
    listed = Settings(bootstrap="127.0.0.1:9101,127.0.0.1:9102,127.0.0.1:9103", home=tmp_path, jars=tmp_path / "jars")
    cluster = LocalKafkaCluster.for_settings(listed, 3)
    assert cluster is not None and cluster.ports == [9101, 9102, 9103] and cluster.node_ids == [1, 2, 3]
    assert LocalKafkaCluster.for_settings(Settings(bootstrap="127.0.0.1:9200", home=tmp_path), 3).ports == [9200, 9201, 9202]
    assert LocalKafkaCluster.for_settings(Settings(bootstrap="kafka.example:9092"), 3) is None
    node = cluster.node(2)  # the layout is chosen once: every node knows the same quorum and cluster id
    assert node.port == 9102 and node.node_id == 2 and set(node.quorum) == {1, 2, 3}
    assert cluster.node(3).cluster_id == node.cluster_id and cluster.node(1).quorum == node.quorum
    assert not set(node.quorum.values()) & set(cluster.ports)
    assert LocalKafkaCluster.for_settings(listed) is not None  # found again without saying its size
    with pytest.raises(BrokerError, match="holds a cluster on ports"):
        LocalKafkaCluster(tmp_path / "kafka-cluster", tmp_path / "jars", [1, 2, 3]).node(1)


def test_dev_up_with_brokers_off_loopback_is_a_usage_error(tmp_path: Path) -> None:
    env = {**os.environ, "LOCKSTEP_HOME": str(tmp_path), "LOCKSTEP_BOOTSTRAP": "kafka.example:9092"}
    result = run_lockstep("dev", "up", "--brokers", "3", env=env, timeout=60)
    assert result.returncode == 2 and "only run on loopback" in result.stderr
