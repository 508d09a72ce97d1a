"""``lockstep demo`` end to end: a real worker, the shopping pipeline, the generator, reads at
every level; exit 0 with zero anomalies, and Ctrl-C stops everything it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lockstep.dev.broker import free_port
from lockstep.dev.worker import healthy
from tests.support import ROOT, run_lockstep

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def demo_env(coordinator_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The test broker (which the demo reuses) and a coordinator URL nobody answers at yet."""
    return {**coordinator_env, "LOCKSTEP_HOME": str(tmp_path / "demo"), "LOCKSTEP_BARRIER_INTERVAL_MS": "500",
            "LOCKSTEP_COORDINATOR_URL": f"http://127.0.0.1:{free_port()}", "PYSPARK_PYTHON": sys.executable}


def generators_running(rate: str) -> list[int]:
    """Pids of ``lockstep datagen shopping --rate <rate>`` processes."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"datagen" in command and rate.encode() in command:
            pids.append(int(entry.name))
    return pids


def test_demo_reads_consistently_and_stops_what_it_started(demo_env: dict[str, str]) -> None:
    """Read through ``lockstep serve`` (the demo's other readers are checked in test_reads and
    test_snapshot): its server starts, reads at every level and stops with the demo."""
    done = run_lockstep("demo", "--seconds", "35", "--warmup", "5", "--rate", "301", "--reader", "serve", env=demo_env,
                        timeout=500)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "reading through lockstep serve on 127.0.0.1:" in out
    assert "using the Kafka broker at" in out and "starting a coordinator worker" in out
    assert "OK: read-committed" in out and "read-uncommitted:" in out
    assert "summary:" in out and "E2E p50" in out and "bottleneck" in out
    assert "stopped the coordinator worker this demo started" in out
    assert not healthy(demo_env["LOCKSTEP_COORDINATOR_URL"])
    assert generators_running("301") == []


def test_ctrl_c_stops_everything_the_demo_started(demo_env: dict[str, str]) -> None:
    demo = subprocess.Popen([sys.executable, "-m", "lockstep", "demo", "--seconds", "600", "--rate", "302"],
                            env=demo_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(demo.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while not any("reads," in line for line in lines):  # the first progress line: reads are happening
            assert demo.poll() is None and time.monotonic() < deadline, "".join(lines)[-4000:]
            time.sleep(0.5)
        assert generators_running("302")
        os.killpg(demo.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        assert demo.wait(180) == 130, "".join(lines)[-4000:]
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    reader.join(10)
    out = "".join(lines)
    assert "interrupted: stopping what the demo started" in out and "summary:" in out
    assert "stopped the coordinator worker this demo started" in out
    assert not healthy(demo_env["LOCKSTEP_COORDINATOR_URL"])
    assert generators_running("302") == []
