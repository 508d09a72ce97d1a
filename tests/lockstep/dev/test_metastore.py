"""``lockstep dev up --metastore``: the Hive metastore's database of the local stack (Derby's
network server), in its own home and port."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from coordinator.settings import Settings
from lockstep.dev.metastore import LocalMetastore, MetastoreError
from lockstep.dev.service import HOST, free_port, process_alive
from tests.support import ROOT, run_lockstep

pytestmark = [pytest.mark.integration]


def lockstep(home: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_lockstep(*args, env={**os.environ, "LOCKSTEP_HOME": str(home), "LOCKSTEP_JARS": str(ROOT / ".lockstep/jars"),
                                    **env}, timeout=180)


def test_dev_up_metastore_serves_its_database_and_down_stops_it(tmp_path: Path) -> None:
    url = f"jdbc:derby://{HOST}:{free_port()}/metastore"
    env = {"LOCKSTEP_BOOTSTRAP": f"{HOST}:{free_port()}", "LOCKSTEP_METASTORE": url}
    up = lockstep(tmp_path, env, "dev", "up", "--metastore")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "metastore: pid" in up.stdout and f"LOCKSTEP_METASTORE={url}" in up.stdout
        meta = LocalMetastore.for_settings(Settings.from_env({"LOCKSTEP_HOME": str(tmp_path), **env}))
        assert meta is not None and meta.url == url and (pid := meta.running_pid()) is not None
        socket.create_connection((HOST, meta.port), timeout=5).close()  # Derby's network server accepts
        assert f"metastore: running, pid {pid}, database {url}" in lockstep(tmp_path, env, "dev", "status").stdout
    finally:
        down = lockstep(tmp_path, env, "dev", "down")
    assert down.returncode == 0 and "metastore stopped" in down.stdout
    assert not process_alive(pid)


def test_the_managed_metastore_follows_the_settings(tmp_path: Path) -> None:
    meta = LocalMetastore.for_settings(Settings(home=tmp_path, jars=tmp_path / "jars"))
    assert meta is not None and meta.port == 1527 and meta.url == f"jdbc:derby://{HOST}:1527/metastore"
    assert LocalMetastore.for_settings(Settings(metastore="thrift://meta.example.com:9083")) is None
    missing = LocalMetastore(tmp_path / "m", tmp_path / "no-jars", free_port())
    with pytest.raises(MetastoreError, match="Run scripts/setup"):
        missing.up(timeout=5)


def test_a_metastore_elsewhere_is_not_ours_to_start(tmp_path: Path) -> None:
    env = {"LOCKSTEP_BOOTSTRAP": f"{HOST}:{free_port()}", "LOCKSTEP_METASTORE": "thrift://meta.example.com:9083"}
    done = lockstep(tmp_path, env, "dev", "up", "--metastore")
    assert done.returncode == 2 and "only runs on loopback" in done.stderr
    assert "broker" not in done.stdout  # nothing started
