"""Tables by name: with ``LOCKSTEP_METASTORE`` every job registers its table (and its dead
letters) in a Hive metastore on the local stack's Derby server, so another Spark process
configured for the same metastore reads them with ``spark.table`` and SQL by name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from lockstep.dev.broker import free_port
from lockstep.dev.metastore import LocalMetastore
from tests.support import ROOT
from tests.support.barriers import SEQUENCED_PIPELINE, at, wait_for_barrier
from tests.support.supervising import SequencedFeed

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.barrier_interval_ms(1000)]

# Another process reads by name only: no paths, no Lockstep API, just the metastore.
READER = """
import json, sys
from coordinator.settings import Settings
from spark_jobs.runtime.catalog import forget_table
from spark_jobs.runtime.session import build_session
spark = build_session("by-name", settings=Settings.from_env())
names = sorted(r["tableName"] for r in spark.sql("SHOW TABLES").collect())
counts = {"events": spark.table("events").count(),
          "per_key": spark.sql("SELECT SUM(n) AS n FROM per_key").first()["n"]}
forget_table(spark, "per_key")
after = sorted(r["tableName"] for r in spark.sql("SHOW TABLES").collect())
print("RESULT " + json.dumps({"names": names, "counts": counts, "after_forget": after}))
"""


@pytest.fixture
def metastore(tmp_path: Path, settings: Settings) -> Iterator[LocalMetastore]:
    meta = LocalMetastore(tmp_path / "metastore", settings.jars / "derby", free_port())
    meta.up()
    yield meta
    meta.down()


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def test_every_table_is_readable_by_name_from_another_spark_process(
    spark: SparkSession, make_worker: Callable, make_topic: Callable, kafka_bootstrap: str, tmp_path: Path,
    metastore: LocalMetastore,
) -> None:
    topic = make_topic(partitions=2)
    worker = make_worker()
    env = {**worker.env, "LOCKSTEP_WAREHOUSE": str(tmp_path / "wh"), "LOCKSTEP_METASTORE": metastore.url,
           "PYSPARK_PYTHON": sys.executable}
    settings = Settings.from_env(env)
    pipeline = tmp_path / "pipeline.sql"
    pipeline.write_text(SEQUENCED_PIPELINE.format(topic=topic))
    feed = SequencedFeed(kafka_bootstrap, topic, keys=5, pause=0.05)
    feed.start()
    log = tmp_path / "run.log"
    with open(log, "ab") as out:
        runner = subprocess.Popen([sys.executable, "-m", "lockstep", "run", str(pipeline)], env=env, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    try:
        wait_for_barrier(settings, ["events", "per_key"], {}, topic, timeout=240)  # jobs are up
        feed.halt.set()
        feed.join(30)
        state, b = wait_for_barrier(settings, ["events", "per_key"], feed.ends(), topic, timeout=240)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{log.read_text()[-4000:]}") from None
    finally:
        feed.halt.set()
        stop(runner)
    assert "could not register" not in log.read_text()

    read = subprocess.run([sys.executable, "-c", READER], env=env, capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    lines = [line for line in read.stdout.splitlines() if line.startswith("RESULT ")]
    assert read.returncode == 0 and lines, read.stdout[-2000:] + read.stderr[-4000:]
    result = json.loads(lines[0].removeprefix("RESULT "))
    assert result["names"] == ["events", "events__dlq", "per_key"]
    # by name: each table's newest version, which holds every record (the barrier b covered them all)
    records = len(feed.sent)
    assert result["counts"] == {"events": records, "per_key": records}
    assert at(spark, settings, "events", state.exact_points("events")[b]).count() == records
    # forgetting a name keeps the table's files
    assert result["after_forget"] == ["events", "events__dlq"]
    assert (tmp_path / "wh" / "per_key" / "_delta_log").is_dir()
