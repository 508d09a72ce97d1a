"""The local stack a bench runs on: a broker, a coordinator worker and the bench's child
processes, started and stopped by pid (their CPU counted by role).

The benches that run a pipeline as a user does (freshness, reads, soak, failover, startup,
restart) and those that need only a broker and the coordinator's topics (spark_jobs, nexmark,
transactions) start it from here, so that no bench imports another for its plumbing. A
SIGTERM stops a bench the way Ctrl-C does, through its clean-up: the broker and the children
are stopped, not left running without it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.settings import Settings
from lockstep import signals

if TYPE_CHECKING:
    from lockstep.dev.broker import LocalBroker

ROOT = Path(__file__).resolve().parents[1]
JARS = ROOT / ".lockstep" / "jars"


def start_broker(tmp: Path) -> LocalBroker:
    from lockstep.dev.broker import LocalBroker, free_port

    broker = LocalBroker(tmp / "kafka", ROOT / ".lockstep/jars/kafka", port=free_port(), heap="1g")
    broker.up()
    return broker


@contextmanager
def local_stack() -> Iterator[Settings]:
    """A temporary home with its own local broker and the coordinator's topics; torn down after."""
    from coordinator.client.topics import Topics, ensure_topics

    signals.install()
    with tempfile.TemporaryDirectory() as tmp:
        broker = start_broker(Path(tmp))
        try:
            settings = Settings(bootstrap=broker.bootstrap, warehouse=str(Path(tmp) / "wh"), home=Path(tmp), topic_prefix="bench",
                                jars=JARS)
            ensure_topics(settings, Topics("bench"))
            yield settings
        finally:
            broker.down()


@dataclass
class Processes:
    """Child processes by role, for CPU accounting and clean-up."""

    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    cpu_at_start: dict[str, float] = field(default_factory=dict)

    def start(self, role: str, command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            child = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                     start_new_session=True)
        self.children[role] = child
        return child

    def cpu(self) -> dict[str, float]:
        """CPU seconds (user + system) of each role's process tree so far."""
        import psutil

        out = {}
        for role, child in self.children.items():
            total = 0.0
            try:
                proc = psutil.Process(child.pid)
                for p in [proc, *proc.children(recursive=True)]:
                    try:
                        t = p.cpu_times()
                        total += t.user + t.system + t.children_user + t.children_system
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
            out[role] = total
        return out

    def stop(self, role: str, timeout: float = 60) -> None:
        child = self.children.get(role)
        if child is None or child.poll() is not None:
            return
        os.killpg(child.pid, signal.SIGINT)
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)

    def stop_all(self) -> None:
        for role in reversed(list(self.children)):
            self.stop(role)


@contextmanager
def stack(tmp: Path, system: str, barrier_interval_ms: int | None,
          extra_env: dict[str, str] | None = None) -> Iterator[tuple[dict[str, str], Any]]:
    """A broker on a free port and, for Lockstep, a coordinator worker; the environment to reach them."""
    from lockstep.dev.broker import free_port
    from lockstep.dev.worker import WorkerProcess

    signals.install()
    broker = start_broker(tmp)
    env = {**os.environ, "LOCKSTEP_BOOTSTRAP": broker.bootstrap, "LOCKSTEP_HOME": str(tmp / "home"),
           "LOCKSTEP_JARS": str(ROOT / ".lockstep" / "jars"), "LOCKSTEP_TOPIC_PREFIX": "bench",
           "PYSPARK_PYTHON": sys.executable, "LOCKSTEP_SPARK_LOG_LEVEL": "ERROR"}
    if barrier_interval_ms is not None:
        env["LOCKSTEP_BARRIER_INTERVAL_MS"] = str(barrier_interval_ms)
    env.update(extra_env or {})
    worker = None
    try:
        if system == "lockstep":
            port = free_port()
            env["LOCKSTEP_COORDINATOR_URL"] = f"http://127.0.0.1:{port}"
            worker = WorkerProcess(env, port, tmp / "worker.log").start()
        yield env, (broker, worker)
    finally:
        if worker is not None:
            worker.stop()
        broker.down()


class Pid:
    """A process the bench did not start as a child (the broker), for CPU accounting only."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid or -1

    def poll(self) -> int | None:
        return 0  # never stopped by the bench: the broker's own down() does that


def wait_created(env: dict[str, str], tables: list[str], procs: Processes, log: Path, timeout: float = 300) -> float:
    """Until every table has an exact point (a CTAS table exists once its first barrier committed)."""
    from coordinator.client.rest import get_json

    settings = Settings.from_env(env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(c.poll() is not None for role, c in procs.children.items() if role.startswith("jobs")):
            raise SystemExit(f"lockstep run exited:\n{log.read_text()[-3000:]}")
        try:
            if set(tables) <= set(get_json(settings, "/topology")["tables"]):
                return time.time()
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.5)
    raise SystemExit(f"tables not created within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def wait_tables(settings: Any, tables: list[str], procs: Processes, timeout: float = 300) -> float:
    """Until every plain query has made its table (its first micro-batch committed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(c.poll() is not None for role, c in procs.children.items() if role.startswith("jobs")):
            raise SystemExit("a plain query process exited; run with --keep and read its log")
        if all((Path(settings.table_location(t)) / "_delta_log" / f"{0:020d}.json").exists() for t in tables):
            return time.time()
        time.sleep(0.5)
    raise SystemExit(f"plain tables not created within {timeout:.0f} s")
