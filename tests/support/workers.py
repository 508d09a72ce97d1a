"""Fixtures that run real coordinator workers; loaded as a pytest plugin by tests/conftest.py."""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.client.rest import get_json
from coordinator.settings import Settings
from lockstep.dev.broker import free_port
from lockstep.dev.worker import WorkerProcess
from tests.support import metric_samples, run_lockstep


class Worker(WorkerProcess):
    """A real ``lockstep worker`` process, with the helpers tests need."""

    def get(self, path: str) -> Any:
        """GET JSON; 4xx answers return their JSON error body. A worker on a loaded machine (a
        drill's brokers restarting beside it) may take seconds to answer: 15 s before it counts
        as unreachable."""
        return get_json(Settings(coordinator_url=self.url), path, timeout=15)

    def get_text(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return response.read().decode()

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """/metrics parsed: (sample name, sorted labels) -> value."""
        return metric_samples(self.get_text("/metrics"))

    def metric(self, name: str, **labels: str) -> float | None:
        """One sample of /metrics (``lockstep_fenced_writes_total``, ``table=...``), None if absent."""
        return self.metrics().get((name, tuple(sorted(labels.items()))))

    def barrier_ids(self) -> list[int]:
        """Ids of the barriers the worker's /barriers lists, oldest first."""
        return [b["barrier"] for b in self.get("/barriers?limit=100000")]

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def coordinator_env(settings: Settings, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """Environment for one isolated coordinator: its own topic prefix and home on the test broker.
    Barriers every 200 ms, unless the test is marked ``@pytest.mark.barrier_interval_ms(N)``; state
    kept for 1000 barriers (tests read at barriers from their start; pruning tests set their own);
    tables compacted every 10 commits; the Spark processes it starts compile with C1 only."""
    interval = request.node.get_closest_marker("barrier_interval_ms")
    return {
        **os.environ,
        "LOCKSTEP_BOOTSTRAP": settings.bootstrap,
        "LOCKSTEP_HOME": str(tmp_path / "home"),
        "LOCKSTEP_WAREHOUSE": str(tmp_path / "wh"),  # where run_pipeline's jobs write: /snapshot names it
        "LOCKSTEP_JARS": str(settings.jars),
        "LOCKSTEP_TOPIC_PREFIX": f"t{uuid.uuid4().hex[:8]}",
        "LOCKSTEP_BARRIER_INTERVAL_MS": str(interval.args[0] if interval else 200),
        "LOCKSTEP_RETAIN_BARRIERS": "1000",
        "LOCKSTEP_COMPACT_EVERY": "10",  # pipelines in tests compact often: reads must not notice
        # Spark processes a test starts (`lockstep run`, the demo, queries) live for seconds to a
        # minute: C1-only JIT brings their first commit sooner; the throughput C2 adds later is
        # not what these tests measure (the test session's own Spark keeps both compilers)
        "LOCKSTEP_DRIVER_JVM_OPTIONS": "-XX:TieredStopAtLevel=1",
    }


@pytest.fixture
def make_worker(coordinator_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Factory: ``make_worker()`` starts a coordinator worker on a free port and waits until healthy
    (``env``: more LOCKSTEP_* settings of the worker's own)."""
    workers: list[Worker] = []

    def make(start: bool = True, env: dict[str, str] | None = None) -> Worker:
        port = free_port()
        worker = Worker({**coordinator_env, **(env or {}), "LOCKSTEP_COORDINATOR_URL": f"http://127.0.0.1:{port}"},
                        port, tmp_path / f"worker-{len(workers)}.log")
        workers.append(worker)
        return worker.start() if start else worker

    yield make
    for worker in workers:
        worker.stop()


@pytest.fixture
def lockstep_cli(coordinator_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Factory: run ``lockstep ARGS`` against a coordinator (``url=`` picks its REST address)."""

    def run(*args: str, url: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = dict(coordinator_env)
        if url:
            env["LOCKSTEP_COORDINATOR_URL"] = url
        return run_lockstep(*args, env=env, timeout=timeout)

    return run
