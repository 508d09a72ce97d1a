"""Starting a job: its table's start rule, and state that is not its own. A table of the same name
from another pipeline (another coordinator) is never continued: its Delta table is refused, its
streaming checkpoint is not resumed (even copied where this table's goes), an empty warehouse
under a table with exact points is refused; vacuum removes checkpoints that are not the table's."""

from __future__ import annotations

import dataclasses
import json
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Producer
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from coordinator.client.state import read_state
from coordinator.domain.errors import ForeignState
from coordinator.settings import Settings
from lockstep.dev.broker import free_port
from spark_jobs.ops.jobs import register_pipeline
from spark_jobs.ops.tables import checkpoint_location
from spark_jobs.ops.vacuum import vacuum
from spark_jobs.planning.pipeline import parse_pipeline
from tests.support.barriers import at, wait_for_barrier
from tests.support.supervising import Stack, supervised
from tests.support.workers import Worker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PIPELINE = """
CREATE TABLE events (id BIGINT, v BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json'{start});
CREATE TABLE totals AS SELECT COUNT(*) AS n, SUM(v) AS total FROM events GROUP BY v % 2;
"""


class Ids:
    """Records {"id": i, "v": i} with ids 0, 1, 2, ... to one partition."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer, self.topic, self.next = Producer({"bootstrap.servers": bootstrap}), topic, 0

    def send(self, n: int) -> dict[int, int]:
        """Send ``n`` more; {partition 0: records sent so far}, what wait_for_barrier covers."""
        for i in range(self.next, self.next + n):
            self.producer.produce(self.topic, json.dumps({"id": i, "v": i}).encode())
        self.next += n
        assert self.producer.flush(10) == 0
        return {0: self.next}


@contextmanager
def coordinator(env: dict[str, str], tmp_path: Path, warehouse: Path) -> Iterator[Settings]:
    """A coordinator worker of its own topic prefix (another pipeline's), and settings for it."""
    port, prefix = free_port(), f"o{uuid.uuid4().hex[:8]}"
    worker_env = {**env, "LOCKSTEP_TOPIC_PREFIX": prefix, "LOCKSTEP_COORDINATOR_URL": f"http://127.0.0.1:{port}"}
    worker = Worker(worker_env, port, tmp_path / f"worker-{prefix}.log").start()
    try:
        yield dataclasses.replace(Settings.from_env(worker_env), warehouse=str(warehouse), home=tmp_path / "home")
    finally:
        worker.stop()


def ids(spark: SparkSession, settings: Settings, table: str = "events") -> list[int]:
    """The ids ``table`` holds at its newest exact point, sorted (duplicates kept)."""
    state = read_state(settings)
    version = state.exact_points(table)[state.latest_exact(table)]  # type: ignore[index]
    return sorted(r["id"] for r in at(spark, settings, table, version).collect())


def test_a_latest_start_reads_only_what_comes_after_and_status_says_where_it_began(
    spark: SparkSession, make_stack: Callable[[], Stack], make_topic: Callable[..., str], kafka_bootstrap: str,
) -> None:
    topic = make_topic(partitions=1)
    stack = make_stack()
    records = Ids(kafka_bootstrap, topic)
    records.send(40)  # there before the table: not its to read
    sql = stack.tmp_path / "latest.sql"
    sql.write_text(PIPELINE.format(topic=topic, start=", 'start' = 'latest'"))
    pipeline = parse_pipeline(sql.read_text())
    register_pipeline(stack.settings, pipeline)
    assert [(c.topic, c.partition, c.offset) for c in read_state(stack.settings).tables["events"].start_offsets] == \
        [(topic, 0, 40)]
    with supervised(spark, pipeline, stack.settings, report=print):
        wait_for_barrier(stack.settings, ["events", "totals"], records.send(25), topic)
        assert ids(spark, stack.settings) == list(range(40, 65))
        shown = stack.lockstep("status")
        assert shown.returncode == 0, shown.stderr
        assert f"events started reading at latest: {topic}[0] from offset 40" in shown.stdout, shown.stdout
        explained = stack.lockstep("explain", str(sql))
        assert explained.returncode == 0, explained.stderr
        assert "a new table starts reading each partition at its end when the table is declared" in explained.stdout
        assert f"started reading at latest: {topic}[0] from offset 40 (the coordinator at" in explained.stdout


def test_a_table_of_the_same_name_from_another_pipeline_is_never_continued(
    spark: SparkSession, make_stack: Callable[[], Stack], make_topic: Callable[..., str], kafka_bootstrap: str,
    coordinator_env: dict[str, str], tmp_path: Path,
) -> None:
    topic = make_topic(partitions=1)
    first = make_stack()
    records = Ids(kafka_bootstrap, topic)
    pipeline = parse_pipeline(PIPELINE.format(topic=topic, start=""))
    register_pipeline(first.settings, pipeline)
    with supervised(spark, pipeline, first.settings, report=print):
        wait_for_barrier(first.settings, ["events", "totals"], records.send(30), topic)
    table_id = read_state(first.settings).tables["events"].table_id
    checkpoint = checkpoint_location(first.settings, "ingest_events", read_state(first.settings).tables["events"])
    assert checkpoint == (first.settings.checkpoints / first.settings.topic_prefix / f"events-{table_id}" /
                          "ingest_events").as_uri()
    checkpoint = checkpoint.removeprefix("file://")
    assert Path(checkpoint, "offsets").is_dir()
    history = DeltaTable.forPath(spark, first.settings.table_location("events")).history().count()

    # another pipeline's coordinator, the same warehouse: the folder holds another table of that name
    with coordinator(coordinator_env, tmp_path, tmp_path / "wh") as other:
        register_pipeline(other, pipeline)
        with pytest.raises(ForeignState, match=f"holds another table events \\(table id {table_id}") as refused:
            supervised(spark, pipeline, other, report=print).__enter__()
        assert "Nothing was written" in str(refused.value) and "LOCKSTEP_WAREHOUSE" in str(refused.value)
        assert DeltaTable.forPath(spark, first.settings.table_location("events")).history().count() == history

        # a warehouse of its own, where the first pipeline's checkpoint was copied: not resumed
        fresh = dataclasses.replace(other, warehouse=str(tmp_path / "wh2"))
        register_pipeline(fresh, pipeline)
        mine = checkpoint_location(fresh, "ingest_events", read_state(fresh).tables["events"]).removeprefix("file://")
        shutil.copytree(checkpoint, mine)
        with supervised(spark, pipeline, fresh, report=print):
            wait_for_barrier(fresh, ["events", "totals"], records.send(10), topic)
            assert ids(spark, fresh) == list(range(40))  # every record once, from the first

            # vacuum removes checkpoints that are not this table's, and those an older Lockstep kept
            stray = fresh.checkpoints / fresh.topic_prefix / "events-0123456789abcdef"  # a table dropped before
            legacy = fresh.checkpoints / "ingest_events"  # where an older Lockstep kept it
            shutil.copytree(checkpoint, stray / "ingest_events")
            shutil.copytree(checkpoint, legacy)
            (report, *_) = vacuum(spark, fresh, ["events"])
            assert sorted(report.stale) == sorted([stray.as_uri(), legacy.as_uri()])
            assert not stray.exists() and not legacy.exists() and Path(mine, "offsets").is_dir()

    # the first coordinator, pointed at an empty warehouse: its exact points are not there
    moved = dataclasses.replace(first.settings, warehouse=str(tmp_path / "wh3"))
    with pytest.raises(ForeignState, match="holds no Delta table: LOCKSTEP_WAREHOUSE changed"):
        supervised(spark, pipeline, moved, report=print).__enter__()
    assert not Path(tmp_path, "wh3", "events").exists()
