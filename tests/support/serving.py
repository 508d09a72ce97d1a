"""``lockstep serve`` run as its own process for a test (loaded as a pytest plugin)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo

from coordinator.settings import Settings
from lockstep.dev.broker import free_port
from tests.support import ROOT, wait_until


class Served:
    def __init__(self, process: subprocess.Popen[str], port: int, log: Path) -> None:
        self.process, self.port, self.log = process, port, log

    def dsn(self, **more: str) -> str:
        return make_conninfo(**{"host": "127.0.0.1", "port": self.port, "user": "lockstep", "dbname": "lockstep",
                                "connect_timeout": 10, **more})

    def psql(self, *commands: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ["PATH"], **({"PGPASSWORD": password} if password is not None else {})}
        args = ["psql", "-X", "-h", "127.0.0.1", "-p", str(self.port), "-U", "lockstep", "-d", "lockstep", "-v",
                "ON_ERROR_STOP=0"] + [a for c in commands for a in ("-c", c)]
        return subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)


def env_of(settings: Settings) -> dict[str, str]:
    return {**os.environ, "LOCKSTEP_BOOTSTRAP": settings.bootstrap, "LOCKSTEP_WAREHOUSE": str(settings.warehouse),
            "LOCKSTEP_COORDINATOR_URL": settings.coordinator_url, "LOCKSTEP_TOPIC_PREFIX": settings.topic_prefix}


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Factory: ``serve(settings, *flags, env={...}, cwd=folder)`` runs ``lockstep serve`` on a free port
    until it listens (``env`` replaces the settings' environment if it is a whole one)."""
    started: list[subprocess.Popen[str]] = []

    def start(settings: Settings | None, *flags: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> Served:
        port, log = free_port(), tmp_path / f"serve-{len(started)}.log"
        with open(log, "w") as out:
            process = subprocess.Popen([sys.executable, "-m", "lockstep", "serve", "--port", str(port), *flags],
                                       stdout=out, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                                       env={**(env_of(settings) if settings is not None else {}), **(env or {})})
        started.append(process)
        wait_until(lambda: "serving Lockstep's tables" in log.read_text() or process.poll() is not None,
                   lambda: log.read_text(), timeout=60)
        assert process.poll() is None, log.read_text()
        return Served(process, port, log)

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.wait(30)
