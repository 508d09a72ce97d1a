"""The start-under-load drill, shared by its test (tests/drills/test_start_under_load.py) and its
bench (``python -m bench.startup``): a producer keeps a topic busy while `lockstep run` starts a
root table and two aggregates over it on a fresh topic prefix and warehouse, again and again.

One start (``start_once``): a coordinator worker of its own (a fresh prefix), `lockstep run` in
a process of its own; it counts once a read-committed snapshot of both aggregates resolves (the
newest barrier that is an exact point of both), then `lockstep run` gets SIGTERM and must exit
cleanly (143, no stack trace) within ``STOP_S``.

Example::

    feed = LoadFeed(bootstrap, rate=5000).start()
    result = start_once(env, tmp_path / "start-1", feed)
    assert result.problems() == []
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from coordinator.client.rest import get_json
from coordinator.client.topics import create_topics
from coordinator.domain.errors import ExitCode, Unreachable
from coordinator.domain.snapshot import ReadLevel
from coordinator.settings import Settings
from lockstep.dev.broker import free_port
from lockstep.dev.worker import WorkerProcess
from tests.support import ROOT

PIPELINE = """
CREATE TABLE x (k BIGINT, v BIGINT, seq BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE x1 AS SELECT k, SUM(v) AS total, COUNT(*) AS n FROM x GROUP BY k;
CREATE TABLE x2 AS SELECT k, MAX(v) AS top, COUNT(*) AS n FROM x GROUP BY k;
"""
AGGREGATES = ("x1", "x2")
KEYS = 1000
READ_WITHIN_S = 120.0  # from `lockstep run`'s start to a read-committed read of both aggregates
ADVANCE_WITHIN_S = 30.0  # after it, a read of a newer barrier must come within this (no job stalled)
STOP_S = 30.0  # from SIGTERM to the process's exit
# what a stack trace or an unhandled error looks like in `lockstep run`'s output
TRACE_MARKS = ("Traceback (most recent call last)", "\tat ", "Exception in thread", "ERROR ")


class LoadFeed(threading.Thread):
    """JSON records ``{"k", "v", "seq"}`` over ``KEYS`` keys at ``rate`` a second to the topic
    ``use`` names last (each start gets a fresh topic: nothing before it to catch up on)."""

    def __init__(self, bootstrap: str, rate: int, partitions: int = 2) -> None:
        super().__init__(name="load-feed", daemon=True)
        self.bootstrap, self.rate, self.partitions = bootstrap, rate, partitions
        quiet = {"bootstrap.servers": bootstrap, "log.connection.close": False}  # the broker closes idle ones
        self.producer = Producer({**quiet, "linger.ms": 5})
        self.admin = AdminClient(quiet)
        self.topic: str | None = None
        self.sent = 0
        self.halt = threading.Event()
        self._began = time.monotonic()

    def use(self, topic: str) -> None:
        """Create ``topic`` and produce to it from now on."""
        create_topics(self.admin, [NewTopic(topic, self.partitions, 1)])
        self.topic = topic

    def run(self) -> None:
        rng = random.Random(7)
        self._began = time.monotonic()
        while not self.halt.is_set():
            due = int((time.monotonic() - self._began) * self.rate) - self.sent
            for _ in range(min(max(due, 0), self.rate)):
                if self.topic is not None:
                    k = rng.randrange(KEYS)
                    value = json.dumps({"k": k, "v": rng.randrange(1000), "seq": self.sent}).encode()
                    try:
                        self.producer.produce(self.topic, value, key=str(k).encode())
                    except BufferError:
                        self.producer.poll(0.05)
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.01)
        self.producer.flush(10)

    def rate_so_far(self) -> float:
        return self.sent / max(time.monotonic() - self._began, 1e-9)

    def stop(self) -> None:
        """Stop producing, flush, and let go of the clients (before their broker goes)."""
        self.halt.set()
        self.join(30)
        del self.producer, self.admin


@dataclass
class StartResult:
    """What one start did: seconds from `lockstep run`'s start to each milestone (None: never)."""

    number: int
    rejected: str | None = None  # `lockstep run`'s error line, if it exited before running
    session_s: float | None = None  # "Spark session up"
    first_commits_s: dict[str, float] = field(default_factory=dict)  # table -> its first commit
    read_s: float | None = None  # a read-committed snapshot of both aggregates resolved
    read_barrier: int | None = None
    later_barrier: int | None = None  # a newer read-committed barrier, after ``linger_s`` (None: none came)
    stop_s: float | None = None  # SIGTERM -> exit
    exit_code: int | None = None
    lingered: bool = False  # whether the jobs ran on after the first read, to see reads advance
    traces: list[str] = field(default_factory=list)  # output lines that look like a stack trace
    lines: int = 0
    log: Path | None = None

    def problems(self) -> list[str]:
        """What went wrong, one line each (empty: a clean start and stop)."""
        out = []
        if self.rejected is not None:
            out.append(f"start {self.number}: lockstep run exited before running: {self.rejected}")
        elif self.read_s is None:
            out.append(f"start {self.number}: no read-committed read of {', '.join(AGGREGATES)} within "
                       f"{READ_WITHIN_S:.0f} s (first commits: {self.first_commits_s})")
        elif self.lingered and self.later_barrier is None:
            out.append(f"start {self.number}: read-committed reads stopped at barrier {self.read_barrier}: no newer "
                       f"one within {ADVANCE_WITHIN_S:.0f} s")
        if self.rejected is None and (self.stop_s is None or self.stop_s > STOP_S):
            out.append(f"start {self.number}: SIGTERM -> exit took {self.stop_s} s (at most {STOP_S:.0f} s)")
        if self.rejected is None and self.exit_code != ExitCode.TERMINATED:
            out.append(f"start {self.number}: exit code {self.exit_code} after SIGTERM, not {int(ExitCode.TERMINATED)}")
        if self.traces:
            out.append(f"start {self.number}: {len(self.traces)} stack-trace line(s), first: {self.traces[0]!r}")
        return [f"{line} (log: {self.log})" for line in out]


class RunProcess:
    """`lockstep run` as a child process whose output lines are timestamped as they arrive."""

    def __init__(self, pipeline: Path, env: dict[str, str], log: Path, cwd: Path = ROOT) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "lockstep", "run", str(pipeline)], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                                     start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self._log = log
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self._log, "a") as out:
            for line in self.proc.stdout:
                self.lines.append((time.monotonic() - self.started, line.rstrip("\n")))
                out.write(line)
                out.flush()

    def said(self, text: str) -> float | None:
        return next((at for at, line in self.lines if text in line), None)

    def finish_reading(self) -> None:
        self._reader.join(10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(30)


def _read_committed(settings: Settings) -> int | None:
    """The barrier of a read-committed snapshot of both aggregates, or None (not yet)."""
    try:
        answer = get_json(settings, f"/snapshot?tables={','.join(AGGREGATES)}&level={ReadLevel.READ_COMMITTED}", timeout=5)
    except Unreachable:
        return None
    return None if "error" in answer else int(answer["barrier"])


def diagnose(run: RunProcess, settings: Settings, folder: Path) -> None:
    """What a stuck start was doing, into ``folder``: the coordinator's view (/delays, /state),
    the Spark driver's Java threads (jstack) and every Python thread of `lockstep run` and of its
    Python children, the query's source runners among them (py-spy, when installed)."""
    import psutil

    for path in ("/delays", "/state"):
        try:
            (folder / f"coordinator{path.replace('/', '-')}.json").write_text(json.dumps(get_json(settings, path), indent=1))
        except Unreachable as exc:
            (folder / f"coordinator{path.replace('/', '-')}.json").write_text(str(exc))
    py_spy = Path(sys.executable).with_name("py-spy")
    with open(folder / "stacks.txt", "w") as out:
        for proc in [psutil.Process(run.proc.pid), *psutil.Process(run.proc.pid).children(recursive=True)]:
            try:
                name, command = proc.name(), " ".join(proc.cmdline())[:200]
            except psutil.Error:  # gone, or a zombie
                continue
            out.write(f"==== {proc.pid} {command}\n")
            out.flush()
            if "java" in name:
                subprocess.run(["jstack", str(proc.pid)], stdout=out, stderr=subprocess.STDOUT, timeout=60)
            elif "python" in name and py_spy.exists():
                subprocess.run([str(py_spy), "dump", "--pid", str(proc.pid)], stdout=out, stderr=subprocess.STDOUT,
                               timeout=60)


def start_once(base_env: dict[str, str], folder: Path, feed: LoadFeed, number: int = 1,
               linger_s: float = 0.0) -> StartResult:
    """One start on a fresh prefix, topic and warehouse under ``folder``; see the module's
    docstring. With ``linger_s``, the jobs run at least that much longer after the first read,
    and until a read of a newer barrier resolves (at most ``ADVANCE_WITHIN_S``): a job that
    stalls after its first commits fails the start."""
    folder.mkdir(parents=True, exist_ok=True)
    prefix = f"s{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {**base_env, "LOCKSTEP_TOPIC_PREFIX": prefix, "LOCKSTEP_HOME": str(folder / "home"),
           "LOCKSTEP_WAREHOUSE": str(folder / "wh"), "LOCKSTEP_COORDINATOR_URL": f"http://127.0.0.1:{port}",
           "PYSPARK_PYTHON": sys.executable}
    settings = Settings.from_env(env)
    feed.use(f"{prefix}_events")
    pipeline = folder / "pipeline.sql"
    pipeline.write_text(PIPELINE.format(topic=feed.topic))
    result = StartResult(number, log=folder / "run.log")
    worker = WorkerProcess(env, port, folder / "worker.log").start()
    run = RunProcess(pipeline, env, folder / "run.log")
    try:
        deadline = run.started + READ_WITHIN_S
        while time.monotonic() < deadline and run.proc.poll() is None:
            if (barrier := _read_committed(settings)) is not None:
                result.read_s, result.read_barrier = time.monotonic() - run.started, barrier
                break
            time.sleep(0.5)
        if result.read_s is not None and linger_s > 0:
            result.lingered = True
            began, deadline = time.monotonic(), time.monotonic() + max(linger_s, ADVANCE_WITHIN_S)
            while time.monotonic() < deadline and run.proc.poll() is None:
                barrier = _read_committed(settings)
                if barrier is not None and barrier > (result.read_barrier or 0):
                    result.later_barrier = barrier
                    if time.monotonic() - began >= linger_s:
                        break
                time.sleep(0.5)
        if run.proc.poll() is None and (result.read_s is None or (result.lingered and result.later_barrier is None)):
            diagnose(run, settings, folder)
        if run.proc.poll() is not None:  # exited on its own: rejected, or crashed
            run.finish_reading()
            result.exit_code = run.proc.returncode
            result.rejected = next((line for _, line in reversed(run.lines) if line.strip()), f"exit {run.proc.returncode}")
        else:
            stopped = time.monotonic()
            run.proc.send_signal(signal.SIGTERM)  # what `kill PID`, systemd and Kubernetes send
            try:
                result.exit_code = run.proc.wait(STOP_S * 2)
                result.stop_s = time.monotonic() - stopped
            except subprocess.TimeoutExpired:
                pass
            run.finish_reading()
    finally:
        run.kill()
        worker.stop()
    result.session_s = run.said("Spark session up")
    for table, job in (("x", "ingest_x"), *((a, f"maintain_{a}") for a in AGGREGATES)):
        if (at := run.said(f"job {job} committed barrier")) is not None:
            result.first_commits_s[table] = at
    result.traces = [line for _, line in run.lines if any(mark in line for mark in TRACE_MARKS)]
    result.lines = len(run.lines)
    return result
