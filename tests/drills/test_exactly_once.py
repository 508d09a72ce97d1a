"""Exactly once under kill -9: the job process dies 5 times (LOCKSTEP_DRILL_KILLS), before commits, between
writing a commit's files and committing them (``delta_txn``), between a commit and its completion,
between a keyed table's state commit and its table's commit, and at random moments, while a
producer keeps writing. After every restart the tables must hold each record
exactly once: per key, sequence numbers 1..n with no gap and no duplicate, and the aggregate
downstream agrees, as does a Python table (a row-wise function kept by appending each barrier's
new rows), a keyed join of the two and a keyed aggregate (their rows and groups in Spark's state
store; the aggregate in the changelog layout, appended and compacted), and an aggregate of the
keyed aggregate (from its changes, the rows they replace kept in a state too); every barrier is
committed once, and the version each completion published is the one the table's history says
holds that barrier. The last, unharmed run may be started again once if its Spark JVM exited
under it (``last_run``): a crash more, not a kill of the drill's."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from coordinator.domain import MetaState
from coordinator.settings import Settings
from tests.support import ROOT
from tests.support.barriers import (
    SEQUENCED_PIPELINE,
    at,
    check_each_record_once,
    check_published_versions,
    wait_for_barrier,
)
from tests.support.supervising import SequencedFeed

# 6 job starts; 1 s barriers (the default): fewer barriers to catch up on after each kill
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.barrier_interval_ms(1000)]

KEYS = 7
# Where each run dies: self-inflicted SIGKILL at a crash point, or killed from outside at random
CRASH_POINTS = ("before_commit:0.5", "after_write_files:0.5", "before_completion:0.5", "after_state_commit:0.5", None)
KILLS = int(os.environ.get("LOCKSTEP_DRILL_KILLS", "5"))  # each crash point once, one kill from outside; more: the variable
RUNS = [CRASH_POINTS[i % len(CRASH_POINTS)] for i in range(KILLS)]
TABLES = ["events", "per_key", "evens", "mean_seq", "evens_joined", "per_key_state", "state_totals"]
KEYED = """
CREATE TABLE evens_joined WITH ('state' = 'keyed') AS
  SELECT e.k, e.seq FROM events e JOIN evens v ON e.k = v.k AND e.seq = v.seq;
CREATE TABLE per_key_state WITH ('state' = 'keyed', 'layout' = 'changelog') AS
  SELECT k, COUNT(*) AS n, MAX(seq) AS last_seq, SUM(seq) AS total FROM events GROUP BY k;
CREATE TABLE state_totals AS SELECT n % 2 AS parity, COUNT(*) AS keys, SUM(total) AS total FROM per_key_state GROUP BY n % 2;
"""
PYTHON_TABLES = '''
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.api import pipelines as dp


@dp.materialized_view
def evens(events: DataFrame) -> DataFrame:  # over a table that only grows: new rows appended
    return events.where("seq % 2 = 0")


@dp.materialized_view
def mean_seq(per_key: DataFrame) -> DataFrame:  # over a keyed table: the changed keys' rows replaced
    return per_key.select("k", (F.col("total") / F.col("n")).alias("mean"))
'''


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process of the group is left (the JVM outlives its Python parent briefly)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)
    deadline = time.monotonic() + 30
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)


def last_run(start: Callable[[str | None], subprocess.Popen[bytes]], settings: Settings, topic: str,
             ends: dict[int, int], log: Path, outcomes: list, timeout: float = 420) -> tuple[MetaState, int]:
    """Run the pipeline, unharmed, until every table has a common exact point past the feed's
    ``ends``. A run whose Spark JVM exited under it (said in one line) is started again once, as
    a service manager would: that is one more crash for the tables to survive. Any other end of
    the run, or a second one, fails with the run's errors as well as its last lines."""
    deadline = time.monotonic() + timeout
    began = log.stat().st_size
    proc, again = start(None), True
    try:
        while True:
            try:
                return wait_for_barrier(settings, TABLES, ends, topic, timeout=min(20, max(1, deadline - time.monotonic())))
            except AssertionError as exc:
                text = log.read_text()[began:]
                if proc.poll() is not None and again and "error: Spark's driver JVM " in text:
                    print(f"the last run's JVM exited under it ({proc.returncode}): started again\n{errors_in(text)}")
                    proc, again = start(None), False
                elif proc.poll() is not None or time.monotonic() >= deadline:
                    raise AssertionError(f"{exc}; runs: {outcomes}, the last one ended {proc.poll()}\n"
                                         f"its errors:\n{errors_in(text)}\nits last lines:\n{text[-3000:]}") from None
    finally:
        kill_group(proc)


def errors_in(text: str, most: int = 30) -> str:
    """The first lines of a run's log that say an error or an exception, without their stack frames."""
    lines = [line for line in text.splitlines() if re.search(r"ERROR|Error|Exception|error:", line) and not line.startswith("\t")]
    return "\n".join(lines[:most])


def test_kill_minus_nine_at_any_moment_loses_and_duplicates_nothing(
    spark: SparkSession, make_worker: Callable, make_topic: Callable, kafka_bootstrap: str, tmp_path: Path
) -> None:
    rng = random.Random(5)
    topic = make_topic(partitions=2)
    worker = make_worker()
    env = {**worker.env, "LOCKSTEP_WAREHOUSE": str(tmp_path / "wh"), "PYSPARK_PYTHON": sys.executable}
    settings = Settings.from_env(env)
    pipeline_file = tmp_path / "pipeline.sql"
    pipeline_file.write_text(SEQUENCED_PIPELINE.format(topic=topic) + KEYED)
    python_file = tmp_path / "evens.py"
    python_file.write_text(PYTHON_TABLES)
    feed = SequencedFeed(kafka_bootstrap, topic, KEYS)
    feed.start()
    log = tmp_path / "run.log"
    outcomes = []

    def start(crash: str | None) -> subprocess.Popen[bytes]:
        run_env = {**env, "LOCKSTEP_CRASH_AT": crash} if crash else env
        with open(log, "ab") as out:
            return subprocess.Popen([sys.executable, "-m", "lockstep", "run", str(pipeline_file), str(python_file)], env=run_env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)

    try:
        for crash in RUNS:
            began = time.monotonic()
            proc = start(crash)
            try:
                proc.wait(timeout=120 if crash else rng.uniform(6, 14))
            except subprocess.TimeoutExpired:
                pass
            outcomes.append((crash, proc.poll()))
            ran = time.monotonic() - began
            kill_group(proc)
            print(f"run {len(outcomes)} ({crash}): died after {ran:.1f} s, gone after {time.monotonic() - began:.1f} s")
        feed.halt.set()
        feed.join(30)
        state, b = last_run(start, settings, topic, feed.ends(), log, outcomes)
    finally:
        feed.halt.set()

    # a restarted runner's CTAS table was never taken for abandoned (it has no commit before its first)
    assert "went silent" not in log.read_text()
    killed = [crash for crash, code in outcomes if code in (None, -signal.SIGKILL)]
    assert len(killed) == KILLS, f"a run ended by itself, not by a kill: {outcomes}\n{log.read_text()[-3000:]}"
    fired = Counter(crash.split(":")[0] for crash, code in outcomes if crash and code == -signal.SIGKILL)
    assert all(fired[point.split(":")[0]] >= 1 for point in CRASH_POINTS if point), \
        f"every crash point must fire: {outcomes}\n{log.read_text()[-3000:]}"
    print(f"{KILLS} kills: crash points fired {dict(fired)}, the rest killed from outside")
    check_each_record_once(spark, settings, state, b, topic, feed.expected())
    rows = {t: Counter((r["k"], r["seq"]) for r in at(spark, settings, t, state.exact_points(t)[b]).collect())
            for t in ("events", "evens", "evens_joined")}
    assert rows["evens"] == Counter({row: n for row, n in rows["events"].items() if row[1] % 2 == 0})
    assert rows["evens_joined"] == rows["evens"]  # each even record once, though its state outlived the kills
    groups = {t: sorted(tuple(r) for r in at(spark, settings, t, state.exact_points(t)[b])
                        .select("k", "n", "last_seq", "total").collect()) for t in ("per_key", "per_key_state")}
    assert groups["per_key_state"] == groups["per_key"]  # each record counted once, though its state outlived the kills
    keys, totals = Counter(n % 2 for _, n, _, _ in groups["per_key"]), Counter[int]()
    for _, n, _, total in groups["per_key"]:
        totals[n % 2] += total
    got = at(spark, settings, "state_totals", state.exact_points("state_totals")[b]).collect()
    assert {r["parity"]: (r["keys"], r["total"]) for r in got} == {p: (keys[p], totals[p]) for p in keys}
    per_key = {r["k"]: r["total"] / r["n"] for r in at(spark, settings, "per_key", state.exact_points("per_key")[b]).collect()}
    assert {r["k"]: r["mean"] for r in at(spark, settings, "mean_seq", state.exact_points("mean_seq")[b]).collect()} == per_key
    for table in TABLES:
        check_published_versions(spark, settings, state, table, b)
