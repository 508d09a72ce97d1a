"""``lockstep run``'s exit codes, as a shell sees them: 1 once a job ended FAILED, 130 on Ctrl-C,
each after its jobs were stopped; and what it serves while it runs (the jobs' own metrics)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from lockstep.cli import cli
from lockstep.dev.broker import free_port
from tests.support import ROOT, metric_samples, wait_until
from tests.support.barriers import wait_for_barrier
from tests.support.supervising import KeyedRecords

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT_TABLE = "CREATE TABLE events (k BIGINT, v BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');\n"
BROKEN = "CREATE TABLE broken AS SELECT k, CAST(assert_true(v < 0) AS INT) AS negative FROM events;\n"


def test_run_exits_1_once_a_job_gave_up_failed(
    spark: SparkSession, run_pipeline: Callable[[str], Settings], make_topic: Callable, kafka_bootstrap: str,
    coordinator_env: dict[str, str], tmp_path: Path,
) -> None:
    topic = make_topic()
    settings = run_pipeline(ROOT_TABLE.format(topic=topic))  # the root job runs in this test's process
    wait_for_barrier(settings, ["events"], KeyedRecords(kafka_bootstrap, topic).send(5), topic)
    pipeline = tmp_path / "pipeline.sql"
    pipeline.write_text(ROOT_TABLE.format(topic=topic) + BROKEN)
    env = {**coordinator_env, "LOCKSTEP_WAREHOUSE": settings.warehouse, "LOCKSTEP_HOME": str(settings.home),
           "LOCKSTEP_COORDINATOR_URL": settings.coordinator_url}
    # in this process, so `run` finds the test's Spark session running instead of starting one
    result = CliRunner().invoke(cli, ["run", str(pipeline), "--job", "broken", "--max-restarts", "0"], env=env,
                                prog_name="lockstep")
    assert result.exit_code == 1, result.output
    assert "maintain_broken gave up after 1 failure(s) (FAILED)" in result.output
    assert "error: job(s) maintain_broken ended FAILED" in result.output


@dataclass
class Running:
    """A ``lockstep run`` in a session of its own, its output collected line by line as it comes."""

    proc: subprocess.Popen[str]
    lines: list[str]
    reader: threading.Thread

    @classmethod
    def first_commit(cls, pipeline: Path, env: dict[str, str], *flags: str) -> Running:
        """``lockstep run PIPELINE FLAGS``, once its job committed its first barrier."""
        proc = subprocess.Popen([sys.executable, "-m", "lockstep", "run", str(pipeline), *flags], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
        reader.start()
        running = cls(proc, lines, reader)
        with running.killed_on_failure():
            wait_until(lambda: proc.poll() is not None or any("committed barrier" in line for line in lines),
                       "the job's first commit", 180)
            assert proc.poll() is None, running.output()[-3000:]
        return running

    def output(self) -> str:
        return "".join(self.lines)

    @contextmanager
    def killed_on_failure(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise

    def ended(self, code: int, within: float) -> str:
        """Its whole output, once it exited with ``code`` within ``within`` seconds (killed if not)."""
        with self.killed_on_failure():
            assert self.proc.wait(within) == code, self.output()[-3000:]
        self.reader.join(10)
        return self.output()


def java_child(pid: int) -> int:
    """The pid of the JVM that process ``pid`` started (pyspark's gateway: Spark's driver)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, rest = stat.read_text().split(" (", 1)[1].rsplit(")", 1)
        except (OSError, IndexError, ValueError):
            continue
        if comm == "java" and int(rest.split()[1]) == pid:
            return int(stat.parent.name)
    raise AssertionError(f"process {pid} has no java child")


def test_ctrl_c_stops_the_jobs_and_exits_130(make_worker: Callable, make_topic: Callable, tmp_path: Path) -> None:
    topic = make_topic()
    worker = make_worker()
    pipeline = tmp_path / "pipeline.sql"
    pipeline.write_text(ROOT_TABLE.format(topic=topic))
    env = {**worker.env, "LOCKSTEP_WAREHOUSE": str(tmp_path / "wh"), "PYSPARK_PYTHON": sys.executable}
    metrics = f"127.0.0.1:{free_port()}"  # the jobs' own figures
    run = Running.first_commit(pipeline, env, "--metrics-address", metrics)
    with run.killed_on_failure():
        assert any(line.startswith("Spark session up in ") for line in run.lines)
        assert any(line.startswith(f"live page: {worker.url}") for line in run.lines)
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as response:
            figures = metric_samples(response.read().decode())
        assert figures[("lockstep_job_barriers_committed_total", (("job", "ingest_events"),))] >= 1
        assert figures[("lockstep_job_commit_seconds_count", (("job", "ingest_events"),))] >= 1
        assert any(name == "lockstep_job_phase_seconds_count" for name, _ in figures)
        os.killpg(run.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out = run.ended(130, within=120)
    assert "stopping: each job's barrier in progress commits first" in out and "interrupted" in out
    assert "Traceback" not in out and "\tat " not in out, out[-3000:]  # the batch in progress was not cut off


def test_a_driver_jvm_that_exits_under_the_jobs_is_said_once_with_exit_1(
    make_worker: Callable, make_topic: Callable, tmp_path: Path,
) -> None:
    topic = make_topic()
    pipeline = tmp_path / "pipeline.sql"
    pipeline.write_text(ROOT_TABLE.format(topic=topic))
    env = {**make_worker().env, "LOCKSTEP_WAREHOUSE": str(tmp_path / "wh"), "PYSPARK_PYTHON": sys.executable}
    run = Running.first_commit(pipeline, env)
    with run.killed_on_failure():
        os.kill(java_child(run.proc.pid), signal.SIGKILL)  # as Spark's own exit on a fatal error, or the OOM killer
    out = run.ended(1, within=60)
    assert "error: Spark's driver JVM was killed by signal 9" in out, out[-3000:]
    assert "running the pipeline again continues each job from its last committed barrier" in out
    assert "Traceback" not in out and "did not stop cleanly" not in out, out[-3000:]
