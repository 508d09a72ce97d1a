"""``lockstep dev up --s3``: the S3-API server of the local stack, in its own home and port."""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from coordinator.settings import Settings
from lockstep.dev.s3 import LocalS3
from lockstep.dev.service import HOST, free_port, process_alive
from tests.support import ROOT, run_lockstep

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def lockstep(home: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_lockstep(*args, env={**os.environ, "LOCKSTEP_HOME": str(home), "LOCKSTEP_JARS": str(ROOT / ".lockstep/jars"),
                                    **env}, timeout=180)


def test_dev_up_s3_serves_the_warehouse_bucket_and_down_stops_it(tmp_path: Path) -> None:
    endpoint = f"http://{HOST}:{free_port()}"
    env = {"LOCKSTEP_BOOTSTRAP": f"{HOST}:{free_port()}", "LOCKSTEP_S3_ENDPOINT": endpoint,
           "LOCKSTEP_WAREHOUSE": "s3a://lake/warehouse"}
    up = lockstep(tmp_path, env, "dev", "up", "--s3")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"endpoint {endpoint}, buckets lake" in up.stdout and f"LOCKSTEP_S3_ENDPOINT={endpoint}" in up.stdout
        s3 = LocalS3.for_settings(Settings.from_env({"LOCKSTEP_HOME": str(tmp_path), **env}))
        assert s3 is not None and (pid := s3.running_pid()) is not None
        assert (tmp_path / "s3" / "data" / "lake").is_dir()
        with urllib.request.urlopen(f"{endpoint}/lake/", timeout=5) as listing:  # an S3 answer: the bucket's listing
            assert b"<ListBucketResult" in listing.read()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{endpoint}/lake/no-such-key", timeout=5)
        assert missing.value.code == 404 and b"NoSuchKey" in missing.value.read()
        status = lockstep(tmp_path, env, "dev", "status")
        assert f"s3: running, pid {pid}, endpoint {endpoint}" in status.stdout
    finally:
        down = lockstep(tmp_path, env, "dev", "down")
    assert down.returncode == 0 and "s3 stopped" in down.stdout
    assert not process_alive(pid)


def test_the_managed_s3_follows_the_settings(tmp_path: Path) -> None:
    s3 = LocalS3.for_settings(Settings(home=tmp_path, jars=tmp_path / "jars", warehouse="s3a://lake/wh"))
    assert s3 is not None and s3.port == 9000 and s3.buckets == ("lake",) and s3.home == (tmp_path / "s3").absolute()
    assert LocalS3.for_settings(Settings.from_env({"LOCKSTEP_S3_ENDPOINT": "https://s3.example.com"})) is None
