"""The README's quick start, typed as a new user types it, twice in a row in one LOCKSTEP_HOME:
the second time starting over (`lockstep dev down`, the broker's data and the warehouse removed),
as one does to try it again. Both times `lockstep query` prints the README's table. An older
Lockstep kept each job's checkpoint in $LOCKSTEP_HOME/checkpoints by job name, so the second
`lockstep run` resumed the first one's and its root skipped the six clicks.

The first time runs in the checkout, as the README says; the second in an empty folder of the
user's own, with the pipeline's files copied there and no LOCKSTEP_JARS (the jars are where
`scripts/setup` recorded them), and `lockstep serve` from there answers psql's question too:
an older Lockstep looked for its jars in ./.lockstep of the current folder only."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from coordinator.domain.errors import ExitCode
from coordinator.installed import Installed
from lockstep.dev.broker import HOST, free_port
from lockstep.dev.worker import WorkerProcess
from tests.support import ROOT, run_lockstep, wait_until
from tests.support.serving import Served
from tests.support.starts import RunProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

README = (ROOT / "README.md").read_text()
COMMANDS = re.search(r"After `scripts/setup` and `source .venv/bin/activate`:\n\n```bash\n(.*?)```", README, re.S)
PRINTED = re.search(r"then the query\nprints:\n\n```text\n(.*?)```", README, re.S)


def readme_commands() -> list[list[str]]:
    """The quick start's five commands, as the README gives them (without their comments)."""
    assert COMMANDS is not None, "the README's quick start moved: update this test's pattern"
    return [line.split("#")[0].strip().split(" ", 1) for line in COMMANDS.group(1).splitlines()]


def query_table(env: dict[str, str], sql: str, folder: Path) -> str:
    """What `lockstep query SQL` prints once the table answers (the jobs' first commit may still come)."""
    def printed() -> str | None:
        done = run_lockstep("query", sql, env=env, timeout=60, cwd=folder)
        return done.stdout if done.returncode == 0 and "/pay" in done.stdout else None
    return wait_until(printed, "a read of views_per_page with every page", timeout=120)


def quick_start(env: dict[str, str], home: Path, attempt: int, folder: Path = ROOT,
                serve: Callable[..., Served] | None = None) -> str:
    """The five commands in ``folder`` with the state in ``home``; returns what the query printed
    (and with ``serve``, checks that `lockstep serve` started there answers the same query)."""
    (dev_up, worker, datagen, run, query) = readme_commands()
    assert dev_up == ["lockstep", "dev up"] and worker == ["lockstep", "worker"] and run[1].startswith("run ")
    up = run_lockstep(*dev_up[1].split(), env=env, timeout=180, cwd=folder)
    assert up.returncode == 0, up.stdout + up.stderr
    coordinator = WorkerProcess(env, int(env["LOCKSTEP_COORDINATOR_URL"].rsplit(":", 1)[1]), home / f"worker-{attempt}.log",
                                cwd=folder)
    jobs = None
    try:
        coordinator.start()
        command, _, source = datagen[1].partition(" < ")
        with open(folder / source) as clicks:
            sent = subprocess.run([sys.executable, "-m", "lockstep", *command.split()], stdin=clicks, env=env,
                                  cwd=folder, capture_output=True, text=True, timeout=120)
        assert sent.returncode == 0, sent.stderr
        jobs = RunProcess(Path(run[1].split()[1]), env, home / f"run-{attempt}.log", cwd=folder)
        sql = query[1].split(" ", 1)[1].strip('"')
        printed = query_table(env, sql, folder)
        if serve is not None:
            served = serve(None, env=env, cwd=folder)
            with psycopg.connect(served.dsn(), autocommit=True) as conn:
                rows = conn.execute(sql).fetchall()
            assert [page for page, *_ in rows] == re.findall(r"(/\w+)", printed), (rows, printed)
        return printed
    finally:
        if jobs is not None:
            jobs.proc.send_signal(signal.SIGTERM)
            assert jobs.proc.wait(60) == ExitCode.TERMINATED
        coordinator.stop()
        down = run_lockstep("dev", "down", env=env, timeout=120, cwd=folder)
        assert down.returncode == 0, down.stdout + down.stderr


def test_the_quick_start_twice_in_a_row_prints_the_readmes_table_both_times(
    tmp_path: Path, serve: Callable[..., Served]
) -> None:
    assert PRINTED is not None, "the README's printed table moved: update this test's pattern"
    assert Installed.read().jars is not None, "scripts/setup records where it put the jars: run it again"
    home = tmp_path / "home"
    env = {**{k: v for k, v in os.environ.items() if k != "LOCKSTEP_JARS"}, "LOCKSTEP_HOME": str(home),
           "LOCKSTEP_WAREHOUSE": str(home / "warehouse"), "LOCKSTEP_BOOTSTRAP": f"{HOST}:{free_port()}",
           "LOCKSTEP_COORDINATOR_URL": f"http://{HOST}:{free_port()}", "PYSPARK_PYTHON": sys.executable,
           "LOCKSTEP_DRIVER_JVM_OPTIONS": "-XX:TieredStopAtLevel=1"}  # C1 only: a sooner first commit
    own = tmp_path / "my-project"  # the second time: a folder of the user's own, the pipeline's files in it
    (own / "pipelines").mkdir(parents=True)
    for name in ("clicks.sql", "clicks.jsonl"):
        shutil.copy(ROOT / "pipelines" / name, own / "pipelines" / name)
    for attempt, folder in ((1, ROOT), (2, own)):
        printed = quick_start(env, home, attempt, folder, serve if folder == own else None)
        assert printed.strip() == PRINTED.group(1).strip(), f"attempt {attempt} printed:\n{printed}"
        shutil.rmtree(home / "kafka")  # starting over: an empty broker and warehouse, the same home
        shutil.rmtree(home / "warehouse")
    # the user's folder holds what they put there, and nothing of Lockstep's (that went to its home)
    assert sorted(p.relative_to(own).as_posix() for p in own.rglob("*")) == [
        "pipelines", "pipelines/clicks.jsonl", "pipelines/clicks.sql"]
