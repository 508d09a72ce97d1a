"""Revision while the pipeline runs and is read: (a) a job's query was wrong: the pipeline is run
again with the fixed query and its table revised from a barrier; (b) a root table's data went
wrong: it is revised and re-ingested from a barrier; (c) everything from scratch (--full).
A Python table (a row-wise function, kept by appending new rows) is revised with its source, and
so are a keyed join of the two and a keyed aggregate (their rows and groups in Spark's state
store: a revision starts a new state, an UPDATE of their source rebuilds it). Read-committed reads see no anomaly at any time, and
afterwards every exact point after the barrier matches the oracle."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from coordinator.domain import MetaState
from coordinator.settings import Settings
from lockstep_reads import SnapshotError, open_snapshot
from spark_jobs.ops.jobs import register_pipeline
from spark_jobs.planning.pipeline import joined, load_pipeline, parse_pipeline
from tests.support.barriers import at, wait_for_barrier
from tests.support.supervising import KeyedRecords, Stack, supervised

# 1 s barriers (the default): a revision from scratch has fewer barriers to catch up on
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.barrier_interval_ms(1000)]

PIPELINE = """
CREATE TABLE events (k BIGINT, v BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE mid AS SELECT k, SUM(v) AS total FROM events {where} GROUP BY k;
CREATE TABLE top AS SELECT COUNT(*) AS groups, SUM(total) AS grand FROM mid;
CREATE TABLE counts WITH ('state' = 'keyed') AS SELECT k, COUNT(*) AS n FROM events GROUP BY k;
CREATE TABLE busy AS SELECT k, COUNT(*) AS n, MAX(v) AS top FROM events GROUP BY k HAVING COUNT(*) >= 3;
CREATE TABLE odd_joined WITH ('state' = 'keyed') AS
  SELECT e.k, e.v FROM events e JOIN odd o ON e.k = o.k AND e.v = o.v;
"""
PYTHON = '''
from pyspark.sql import DataFrame

from spark_jobs.api import pipelines as dp


@dp.materialized_view
def odd(events: DataFrame) -> DataFrame:
    return events.where("v % 2 = 1")
'''
WRONG = "WHERE v % 3 <> 0"  # the bug: drops every third value
TABLES = ["events", "mid", "top", "counts", "busy", "odd", "odd_joined"]  # busy: by group (HAVING); odd: Python



class Reader(threading.Thread):
    """Read-committed reads of all the tables until stopped; records every broken invariant."""

    def __init__(self, spark: SparkSession, settings: Settings) -> None:
        super().__init__(daemon=True)
        self.spark, self.settings = spark, settings
        self.stop = threading.Event()
        self.reads: list[int] = []
        self.anomalies: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with open_snapshot(TABLES, settings=self.settings, spark=self.spark) as snap:
                    rows = {t: snap.table(t).collect() for t in TABLES}
            except SnapshotError:
                continue  # no common exact point yet
            mid = {r["k"]: r["total"] for r in rows["mid"]}
            (top,) = rows["top"]
            if (top["groups"], top["grand"] or 0) != (len(mid), sum(mid.values())):
                self.anomalies.append(f"barrier {snap.barrier}: top {top} but mid {mid}")
            if {r["k"]: r["n"] for r in rows["counts"]} != dict(Counter(r["k"] for r in rows["events"])):
                self.anomalies.append(f"barrier {snap.barrier}: counts differ from events")
            if {(r["k"], r["n"], r["top"]) for r in rows["busy"]} != busy([(r["k"], r["v"]) for r in rows["events"]]):
                self.anomalies.append(f"barrier {snap.barrier}: busy differs from events")
            if sorted(r["v"] for r in rows["odd"]) != sorted(r["v"] for r in rows["events"] if r["v"] % 2):
                self.anomalies.append(f"barrier {snap.barrier}: odd differs from events")
            if sorted(tuple(r) for r in rows["odd_joined"]) != sorted(tuple(r) for r in rows["odd"]):
                self.anomalies.append(f"barrier {snap.barrier}: odd_joined differs from odd")
            self.reads.append(snap.barrier or 0)


def busy(events: list[tuple[int, int]]) -> set[tuple[int, int, int]]:
    """The `busy` table's rows over these (k, v) records: keys with 3 records or more."""
    by_key: dict[int, list[int]] = {}
    for k, v in events:
        by_key.setdefault(k, []).append(v)
    return {(k, len(vs), max(vs)) for k, vs in by_key.items() if len(vs) >= 3}


def check_after(spark: SparkSession, settings: Settings, state: MetaState, after: int, cuts: dict[int, int]) -> list[int]:
    """Every common exact point after ``after`` matches the oracle: the fixed query over the
    records its barrier's cut covers. Returns the barriers checked."""
    rows: dict[tuple[str, int], list] = {}

    def read(table: str, b: int) -> list:
        version = state.exact_points(table)[b]
        if (table, version) not in rows:
            rows[table, version] = at(spark, settings, table, version).collect()
        return rows[table, version]

    checked = [b for b in sorted(set.intersection(*(set(state.exact_points(t)) for t in TABLES))) if b > after]
    for b in checked:
        events = [(r["k"], r["v"]) for r in read("events", b)]
        assert sorted(v for _, v in events) == list(range(cuts[b])), f"events at barrier {b}"
        totals: Counter[int] = Counter()
        for k, v in events:
            totals[k] += v
        assert {r["k"]: r["total"] for r in read("mid", b)} == dict(totals), f"mid at barrier {b}"
        (top,) = read("top", b)
        assert (top["groups"], top["grand"] or 0) == (len(totals), sum(totals.values())), f"top at barrier {b}"
        assert {r["k"]: r["n"] for r in read("counts", b)} == dict(Counter(k for k, _ in events)), f"counts at {b}"
        assert {(r["k"], r["n"], r["top"]) for r in read("busy", b)} == busy(events), f"busy at barrier {b}"
        assert sorted((r["k"], r["v"]) for r in read("odd", b)) == sorted(e for e in events if e[1] % 2), f"odd at {b}"
        assert sorted((r["k"], r["v"]) for r in read("odd_joined", b)) == sorted(e for e in events if e[1] % 2), \
            f"odd_joined at {b}"
    return checked


def test_revise_a_fixed_query_and_a_re_ingested_root_while_readers_read(
    spark: SparkSession, make_stack: Callable[[], Stack], make_topic: Callable, kafka_bootstrap: str, tmp_path: Path,
) -> None:
    topic = make_topic(partitions=1)
    stack = make_stack()
    settings = stack.settings
    def cut_offsets(state: MetaState) -> dict[int, int]:
        return {b: next((c.offset for c in a.cut if c.topic == topic), 0) for b, a in state.barriers.items()}

    records = KeyedRecords(kafka_bootstrap, topic, keys=4, value=lambda i: i)
    send = records.send
    (tmp_path / "odd.py").write_text(PYTHON)
    odd = load_pipeline(tmp_path / "odd.py")
    wrong = joined([parse_pipeline(PIPELINE.format(topic=topic, where=WRONG)), odd])
    fixed = joined([parse_pipeline(PIPELINE.format(topic=topic, where="")), odd])
    register_pipeline(settings, wrong)
    reader = Reader(spark, settings)
    with supervised(spark, wrong, settings):
        state, revise_from = wait_for_barrier(settings, TABLES, send(30), topic)
        reader.start()
        wait_for_barrier(settings, TABLES, send(30), topic)
    # (a) the query of `mid` was wrong: fix the pipeline, run it again, revise mid from a barrier
    register_pipeline(settings, fixed)
    with supervised(spark, fixed, settings):
        revised = stack.lockstep("revise", "mid", "--to-barrier", str(revise_from))
        assert revised.returncode == 0, revised.stderr
        assert f"revising mid, top from barrier {revise_from}" in revised.stdout
        state, b = wait_for_barrier(settings, TABLES, send(30), topic)
        assert {t: state.tables[t].generation for t in TABLES} == {"events": 0, "mid": 1, "top": 1, "counts": 0,
                                                                      "busy": 0, "odd": 0, "odd_joined": 0}

        # (b) the root table's data went wrong after barrier b: revise it, re-ingest from b
        bad_from = b
        spark.sql(f"UPDATE delta.`{settings.table_location('events')}` SET v = v + 1000 WHERE k = 1")
        state, now = wait_for_barrier(settings, TABLES, send(30), topic)
        bad = sum(r["total"] for r in at(spark, settings, "mid", state.exact_points("mid")[now]).collect())
        assert bad != sum(range(cut_offsets(state)[now]))  # the bad data reached mid
        revised = stack.lockstep("revise", "events", "--to-barrier", str(bad_from))
        assert revised.returncode == 0, revised.stderr
        assert "revising events, " in revised.stdout
        state, _ = wait_for_barrier(settings, TABLES, send(30), topic)
        assert {t: state.tables[t].generation for t in TABLES} == {"events": 1, "mid": 2, "top": 2, "counts": 1,
                                                                      "busy": 1, "odd": 1, "odd_joined": 1}

    # after both revisions, every exact point after the first revision's barrier is right
    checked = check_after(spark, settings, state, revise_from, cut_offsets(state))
    assert sum(b <= bad_from for b in checked) >= 2 and sum(b > bad_from for b in checked) >= 2, checked

    # (c) from scratch: the root table is emptied and re-reads its topic from the earliest offset
    with supervised(spark, fixed, settings):
        full = stack.lockstep("revise", "events", "--full")
        assert full.returncode == 0 and "from scratch" in full.stdout, full.stderr
        state, _ = wait_for_barrier(settings, TABLES, send(30), topic)
    reader.stop.set()
    reader.join(60)
    assert {t: state.tables[t].generation for t in TABLES} == {"events": 2, "mid": 3, "top": 3, "counts": 2,
                                                                  "busy": 2, "odd": 2, "odd_joined": 2}
    assert len(check_after(spark, settings, state, 0, cut_offsets(state))) >= 2
    assert reader.anomalies == []
    assert len(reader.reads) >= 20, len(reader.reads)
    replayed = stack.lockstep("replay", "--verify")  # the same fold: old generations count nowhere
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    rejected = stack.lockstep("revise", "mid", "--to-barrier", str(10**6))
    assert rejected.returncode == 1 and "not announced yet" in rejected.stderr
