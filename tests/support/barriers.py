"""Waiting for barriers and reading tables at their exact points, for pipeline tests."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from coordinator.client.state import read_state
from coordinator.domain import MetaState
from coordinator.settings import Settings
from spark_jobs.runtime.delta_log import parse_metadata, read_version

# Records {"k", "seq"} (tests.support.supervising.SequencedFeed) and an aggregate over them: the
# drills check that every record is in ``events`` exactly once and that ``per_key`` agrees
SEQUENCED_PIPELINE = """
CREATE TABLE events (k BIGINT, seq BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE per_key AS SELECT k, COUNT(*) AS n, MAX(seq) AS last_seq, SUM(seq) AS total FROM events GROUP BY k;
"""


def wait_for_barrier(
    settings: Settings, tables: list[str], covers: dict[int, int], topic: str, timeout: float = 120
) -> tuple[MetaState, int]:
    """Newest common exact point whose cut covers ``covers`` (partition -> end offset)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = read_state(settings)
        b = state.common_barrier(tables)
        if b is not None:
            cut = {c.partition: c.offset for c in state.barriers[b].cut if c.topic == topic}
            if all(cut.get(p, 0) >= end for p, end in covers.items()):
                return state, b
        time.sleep(0.5)
    raise AssertionError(f"no common exact point covering {covers} within {timeout}s")


def at(spark: SparkSession, settings: Settings, table: str, version: int) -> DataFrame:
    """The table at ``version`` as its readers see it (a changelog table: each key's newest row)."""
    return read_version(spark, settings.table_location(table), version)


def logged_records(settings: Settings, topic: str, cut: dict[int, int]) -> Counter[tuple[int, int]]:
    """(k, seq) of every record the topic holds below ``cut`` (partition -> offset), read as the
    jobs read it (read_committed): the oracle of what a table must hold once each."""
    consumer = Consumer(settings.kafka_config({"group.id": f"oracle-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                                               "isolation.level": "read_committed"}))
    out: Counter[tuple[int, int]] = Counter()
    try:
        for partition, end in cut.items():
            if end <= 0:
                continue
            consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
            while True:
                msg = consumer.poll(10)
                assert msg is not None and msg.error() is None, f"could not read {topic}[{partition}] up to {end}"
                if msg.offset() >= end:
                    break
                value = json.loads(msg.value())
                out[(value["k"], value["seq"])] += 1
                if msg.offset() == end - 1:
                    break
    finally:
        consumer.close()
    return out


def check_each_record_once(spark: SparkSession, settings: Settings, state: MetaState, b: int, topic: str,
                           expected: Counter[int]) -> None:
    """At barrier ``b`` of a SEQUENCED_PIPELINE: ``events`` holds every record the topic holds
    below the barrier's cut exactly once, among them every record the producer had confirmed
    (``expected``: key -> how many, seq 1..n), and ``per_key`` agrees with it."""
    cut = {c.partition: c.offset for c in state.barriers[b].cut if c.topic == topic}
    logged = logged_records(settings, topic, cut)
    for k, n in expected.items():
        missing = [s for s in range(1, n + 1) if (k, s) not in logged]
        assert not missing, f"key {k}: confirmed seqs {missing[:20]} are not in the topic below the cut {cut}"
    rows = Counter((r["k"], r["seq"]) for r in at(spark, settings, "events", state.exact_points("events")[b]).collect())
    if rows != logged:
        lost, twice = logged - rows, rows - logged
        raise AssertionError(
            f"events at barrier {b} is not the topic below the cut {cut} once each: {sum(lost.values())} record(s) "
            f"missing {sorted(lost)[:10]}, {sum(twice.values())} too many {sorted(twice)[:10]}; the topic itself "
            f"holds {sum(c - 1 for c in logged.values())} duplicate(s); "
            f"{range_breaks(state, 'events') or 'the ranges the completions read chain'}")
    per_key: dict[int, list[int]] = {}
    for (k, seq), count in logged.items():
        per_key.setdefault(k, []).extend([seq] * count)
    aggregates = {r["k"]: (r["n"], r["last_seq"], r["total"])
                  for r in at(spark, settings, "per_key", state.exact_points("per_key")[b]).collect()}
    assert aggregates == {k: (len(seqs), max(seqs), sum(seqs)) for k, seqs in per_key.items()}


def range_breaks(state: MetaState, table: str) -> list[str]:
    """Where the offset ranges a root table's completions say they read do not chain (a range
    that does not start where the previous one ended), and cuts that went backwards."""
    breaks: list[str] = []
    ends: dict[tuple[str, int], tuple[int, int]] = {}
    for b, c in sorted(state.completions.get(table, {}).items()):
        for r in c.source_offsets:
            previous = ends.get((r.topic, r.partition))
            if previous is not None and r.start >= 0 and r.start != previous[1]:
                breaks.append(f"barrier {b} read {r.partition}:[{r.start}, {r.end}) after barrier {previous[0]} "
                              f"ended at {previous[1]}")
            ends[(r.topic, r.partition)] = (b, r.end)
    cuts: dict[tuple[str, int], tuple[int, int]] = {}
    for b, announced in sorted(state.barriers.items()):
        for c in announced.cut:
            previous = cuts.get((c.topic, c.partition))
            if previous is not None and c.offset < previous[1]:
                breaks.append(f"barrier {b}'s cut of {c.topic}:{c.partition} is {c.offset}, "
                              f"below barrier {previous[0]}'s {previous[1]}")
            cuts[(c.topic, c.partition)] = (b, c.offset)
    return breaks[:10]


def check_published_versions(spark: SparkSession, settings: Settings, state: MetaState, table: str, upto: int) -> None:
    """Each barrier committed once; every commit up to ``upto`` announced; and each completion's
    version is the one the history says holds its barrier: the newest commit of a barrier <= it."""
    history = DeltaTable.forPath(spark, settings.table_location(table)).history().collect()
    commits = [(parse_metadata(h["userMetadata"]).get("barrier"), h["version"]) for h in history]
    barriers = sorted((b, v) for b, v in commits if b is not None)
    assert len(barriers) == len({b for b, _ in barriers}), f"{table}: a barrier was committed twice"
    published = {c.barrier: c.delta_version for c in state.completions[table].values()}
    assert {b for b, _ in barriers if b <= upto} <= set(published), f"{table}: commits without a completion"
    for barrier, version in published.items():
        holder = max((v for b, v in barriers if b <= barrier), default=0)
        assert version == holder, f"{table}: barrier {barrier} published version {version}; its history says {holder}"
