"""Keyed tables (``WITH ('state' = 'keyed')``) against real Delta tables and Spark's RocksDB state
store, checked barrier by barrier against the same query over the sources' snapshots.

A keyed join through inserts on both sides (bids before their auction too), a barrier that
updates an auction (the state is rebuilt, and a Top-N over the join's table rebuilds its own),
a restart (the state carries on from its checkpoint), a barrier retried after its state was
committed but its table commit was not (vacuum meanwhile leaves the state alone), and a
revision (a new generation starts a new state). A keyed aggregate through bids on new and old
auctions (its groups MERGEd, or the table rewritten where that was measured cheaper), a barrier
whose rows change no group, a restart, a retry and a revision. The same aggregate in the
changelog layout, read through Spark and without it (DataFusion). Two keyed Top-Ns (a running
max_by over strings ordered both ways, and a min_by), in place and in the changelog layout,
through ties, nulls, a restart and a compaction."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from deltalake import DeltaTable as DeltaTable_
from pyspark.sql import SparkSession

from coordinator.domain.work import BarrierWork
from lockstep_reads.engine import run_query
from spark_jobs.ops.vacuum import _unneeded_files
from spark_jobs.planning.pipeline import DerivedTable, parse_pipeline
from spark_jobs.planning.plan import Plan, PlanKind
from spark_jobs.planning.plans import plan_for
from spark_jobs.runtime import costs
from spark_jobs.runtime.commits import DeltaSink
from spark_jobs.runtime.costs import PROBE_EVERY, CostChoice
from spark_jobs.runtime.delta_log import read_version
from spark_jobs.runtime.ivm import TableMaintainer
from spark_jobs.runtime.maintenance.state_stream import STATE_FOLDER
from spark_jobs.runtime.maintenance.table import visible
from spark_jobs.runtime.storage import Storage

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BIDS, AUCTIONS = "auction BIGINT, price BIGINT", "id BIGINT, category BIGINT"
PIPELINE = f"""
CREATE TABLE bids ({BIDS}) WITH ('source' = 'kafka:b');
CREATE TABLE auctions ({AUCTIONS}) WITH ('source' = 'kafka:a', 'primary_key' = 'id');
CREATE TABLE hot WITH ('state' = 'keyed') AS
  SELECT b.auction, b.price, a.category FROM bids b JOIN auctions a ON b.auction = a.id WHERE a.category = 10;
CREATE TABLE stats WITH ('state' = 'keyed') AS
  SELECT auction, price % 2 AS parity, COUNT(*) AS n, COUNT(*) FILTER (WHERE price < 100) AS cheap,
         MIN(price) AS low, MAX(price) AS high, AVG(price) AS mean, SUM(price) AS total
  FROM bids WHERE price >= 0 GROUP BY auction, price % 2;
CREATE TABLE stats_log WITH ('state' = 'keyed', 'layout' = 'changelog') AS
  SELECT auction, price % 2 AS parity, COUNT(*) AS n, MIN(price) AS low, MAX(price) AS high, AVG(price) AS mean
  FROM bids WHERE price >= 0 GROUP BY auction, price % 2;
CREATE TABLE top WITH ('state' = 'keyed') AS
  SELECT * FROM (SELECT auction, price, ROW_NUMBER() OVER (
                   PARTITION BY auction ORDER BY CAST(price % 3 AS STRING) DESC, CAST(price AS STRING)) AS r FROM bids)
  WHERE r <= 3;
CREATE TABLE top_log WITH ('state' = 'keyed', 'layout' = 'changelog') AS
  SELECT * FROM (SELECT auction, price, CAST(price % 7 AS STRING) AS digit,
                        ROW_NUMBER() OVER (PARTITION BY auction ORDER BY CAST(price % 7 AS STRING) NULLS LAST, price DESC) AS r
                 FROM bids WHERE price IS NULL OR price >= 0)
  WHERE r < 3;
CREATE TABLE best WITH ('state' = 'keyed', 'layout' = 'changelog') AS
  SELECT * FROM (SELECT auction, price, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS r FROM hot)
  WHERE r <= 2;
CREATE TABLE by_rank AS
  SELECT r, COUNT(*) AS auctions, SUM(price) AS total, AVG(price) AS mean, MAX(price) AS high FROM best GROUP BY r;
CREATE TABLE by_parity AS
  SELECT parity, COUNT(*) AS groups, SUM(n) AS bids, MIN(low) AS lowest FROM stats_log GROUP BY parity;
CREATE TABLE busy AS SELECT auction, parity, n, high FROM stats_log WHERE n >= 2;
"""


def query_at(spark: SparkSession, warehouse: Path, query: str, versions: dict[str, int]) -> Counter[tuple[Any, ...]]:
    """The rows of ``query`` over the sources at ``versions``: what the table must hold."""
    session = spark.newSession()
    for name, version in versions.items():
        read_version(session, str(warehouse / name), version).createOrReplaceTempView(name)
    return Counter(tuple(r) for r in session.sql(query).collect())


def planned(name: str, kind: PlanKind) -> tuple[DerivedTable, Plan]:
    """Table ``name`` of PIPELINE and its plan, which must be of ``kind`` (and say so)."""
    pipeline = parse_pipeline(PIPELINE)
    table = pipeline.table(name)
    assert isinstance(table, DerivedTable)
    plan = plan_for(pipeline, table)
    assert plan.kind == kind and kind.replace("_", " ") in plan.explain()
    return table, plan


class Completions:
    """Stands in for the Kafka publisher (its own tests are against a real broker)."""

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}

    def publish(self, job_id: str, table: str, barrier: int, generation: int, version: int, *args: Any, **kw: Any) -> None:
        self.seen[barrier] = version

    def close(self) -> None:
        pass


def test_a_keyed_join_equals_its_query_through_inserts_an_update_a_restart_and_a_retry(
        spark: SparkSession, tmp_path: Path) -> None:
    """... and so does a Top-N over its table (q9's way: a join before a Top-N as two keyed
    tables, the Top-N in the changelog layout), which rebuilds its state when it reads the
    join's rebuild among its changes; and an aggregate over the Top-N's table (q4's way), from
    its changes: each barrier's appended rows and the rows they replace, kept by key in its own
    state, which starts over where the Top-N was rebuilt."""
    rng = random.Random(5)
    warehouse = tmp_path / "wh"
    bids = DeltaSink(spark, str(warehouse / "bids"), "ingest_bids", BIDS)
    auctions = DeltaSink(spark, str(warehouse / "auctions"), "ingest_auctions", AUCTIONS)
    table, plan = planned("hot", PlanKind.KEYED_JOIN)
    best, best_plan = planned("best", PlanKind.KEYED_AGGREGATE)
    by_rank, by_rank_plan = planned("by_rank", PlanKind.AGGREGATE)
    assert by_rank_plan.changelog_sources == ("best",) and "state store" in by_rank_plan.explain()
    completions, best_completions, rank_completions = Completions(), Completions(), Completions()

    def maintainer() -> TableMaintainer:
        return TableMaintainer(spark, table, plan, "maintain_hot", lambda name: str(warehouse / name),
                               completions)  # type: ignore[arg-type]

    def best_maintainer() -> TableMaintainer:
        return TableMaintainer(spark, best, best_plan, "maintain_best", lambda name: str(warehouse / name),
                               best_completions)  # type: ignore[arg-type]

    def rank_maintainer() -> TableMaintainer:  # (its changes applied at every barrier, whatever they cost)
        return TableMaintainer(spark, by_rank, by_rank_plan, "maintain_by_rank", lambda name: str(warehouse / name),
                               rank_completions, costs=CostChoice(probe_every=1))  # type: ignore[arg-type]

    def check_best(barrier: int, generation: int = 1) -> None:
        hot = {"hot": completions.seen[barrier]}
        top.process(BarrierWork(barrier, generation, 0, source_versions=hot))
        got = read_version(spark, str(warehouse / "best"), best_completions.seen[barrier])
        assert Counter(tuple(r) for r in visible(got).collect()) == query_at(spark, warehouse, best.query, hot), \
            f"best, barrier {barrier}"
        versions = {"best": best_completions.seen[barrier]}
        work = BarrierWork(barrier, generation, 0, source_versions=versions)
        if barrier == 6:  # its changes' state moved on, its commit never happened (a crash)
            assert ranks[0].changelogs["best"].advance(work, best_completions.seen[5], versions["best"]) is not None
            ranks[0].close()
            ranks[0] = rank_maintainer()
        ranks[0].process(work)
        assert ranks[0].recomputed == (barrier in (1, 4, 7)), barrier  # (else its changes applied)
        got = read_version(spark, str(warehouse / "by_rank"), rank_completions.seen[barrier])
        assert Counter(tuple(r) for r in visible(got).collect()) == query_at(spark, warehouse, by_rank.query, versions), \
            f"by_rank, barrier {barrier}"

    def upsert(rows: list[tuple[int, int]], barrier: int) -> int:  # as a keyed root's ingestion does
        frame = spark.createDataFrame(rows, AUCTIONS)
        return auctions.commit(barrier, 1, lambda: DeltaTable.forPath(spark, auctions.path).alias("t").merge(
            frame.alias("s"), "t.id = s.id").whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())

    def expected(versions: dict[str, int]) -> Counter[tuple[Any, ...]]:
        return query_at(spark, warehouse, table.query, versions)

    def states(name: str = "hot") -> list[str]:  # (a name of the form table/source: a source's changes' states)
        table, _, source = name.partition("/")
        return sorted(p.name for p in (warehouse / table / STATE_FOLDER / source).iterdir())

    def kept(name: str, barrier: int, started: int, generation: int = 1) -> None:
        """The state runs from barrier ``started``; any other folder is an older state's (each
        barrier deletes them, but a stopped query's state store may still write a snapshot into
        its folder for up to a maintenance interval, making it again)."""
        state = f"g{generation}-b{started}"
        older = [n for n in states(name) if n != state]
        assert state in states(name) and all(tuple(map(int, n[1:].split("-b"))) < (generation, started) for n in older), \
            f"{name}, barrier {barrier}: {states(name)}"

    versions: dict[str, int] = {}
    categories: dict[int, int] = {}
    job, top, ranks = maintainer(), best_maintainer(), [rank_maintainer()]
    for barrier in range(1, 7):
        ids = range(barrier * 10, barrier * 10 + 10)
        rows = [(i, rng.choice([10, 11])) for i in ids]
        if barrier == 4:  # auction 10 changes category: a join of inserts cannot retract its rows
            rows.append((10, 21 - categories[10]))
        categories.update(rows)
        versions["auctions"] = upsert(rows, barrier)
        # bids on auctions made so far, and some on auctions of the next barrier (not there yet)
        bid_rows = [(rng.randrange(10, barrier * 10 + 20), rng.randrange(1000)) for _ in range(40)]
        versions["bids"] = bids.commit(barrier, 1, lambda r=bid_rows: spark.createDataFrame(r, BIDS).write.format(
            "delta").mode("append").save(bids.path))
        if barrier == 5:  # a restart: only the states' checkpoints and the tables are left
            for each in (job, top, ranks[0]):
                each.close()
            job, top, ranks[0] = maintainer(), best_maintainer(), rank_maintainer()
        work = BarrierWork(barrier, 1, 0, source_versions=dict(versions))
        if barrier == 6:  # the state committed the barrier, the table commit never happened
            assert job.keyed is not None
            job.keyed._run(work, {"bids": spark.createDataFrame(bid_rows, BIDS),
                                  "auctions": spark.createDataFrame(rows, AUCTIONS)})
            job.close()
            job = maintainer()
            # the batch's joined rows wait in the state's folder: vacuum leaves them (and the state) alone
            path = str(warehouse / "hot")
            version = completions.seen[barrier - 1]
            unneeded = _unneeded_files(spark, Storage(spark), path, version, 1 << 62, version)
            assert unneeded and not [f for f, *_ in unneeded if STATE_FOLDER in f]  # (the overwritten rows are)
            # both sources' rows, staged together, made one micro-batch
            assert len([p for p in (warehouse / "hot" / STATE_FOLDER / "g1-b4" / "out").iterdir()
                        if not p.name.startswith((".", "_"))]) == 1
        job.process(work)
        got = spark.read.format("delta").option("versionAsOf", completions.seen[barrier]).load(str(warehouse / "hot"))
        assert Counter(tuple(r) for r in got.collect()) == expected(versions), f"barrier {barrier}"
        assert {"stage", "state work", "state commit", "write"} <= {p.name for p in job.watch.phases()}, f"barrier {barrier}"
        check_best(barrier)
        for name in ("hot", "best", "by_rank/best"):  # (the Top-N rebuilt with the join's table at barrier 4)
            kept(name, barrier, 1 if barrier < 4 else 4)
    job.process(BarrierWork(7, 2, 0, source_versions=dict(versions)))  # a revision: a new generation, a new state
    got = spark.read.format("delta").option("versionAsOf", completions.seen[7]).load(str(warehouse / "hot"))
    assert Counter(tuple(r) for r in got.collect()) == expected(versions)
    check_best(7, generation=2)
    for name in ("hot", "best", "by_rank/best"):
        kept(name, 7, 7, generation=2)
    for each in (job, top, ranks[0]):
        each.close()


def test_a_keyed_aggregate_equals_its_query_through_old_groups_a_restart_a_retry_and_a_revision(
        spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(7)
    warehouse = tmp_path / "wh"
    bids = DeltaSink(spark, str(warehouse / "bids"), "ingest_bids", BIDS)
    table, plan = planned("stats", PlanKind.KEYED_AGGREGATE)
    completions = Completions()

    def maintainer() -> TableMaintainer:  # (a MERGE at every barrier, whatever it costs, unless told)
        return TableMaintainer(spark, table, plan, "maintain_stats", lambda name: str(warehouse / name),
                               completions, rewrite_limit_bytes=-1, costs=CostChoice(probe_every=1))  # type: ignore[arg-type]

    versions: dict[str, int] = {}
    job = maintainer()
    for barrier in range(1, 7):
        # new auctions' bids, and bids on auctions of any earlier barrier (their groups change);
        # barrier 3's bids are all filtered out by the WHERE: no group changes
        rows = [(rng.randrange(1, barrier * 10 + 10), rng.randrange(-5, 200) if barrier != 3 else -1) for _ in range(30)]
        versions["bids"] = bids.commit(barrier, 1, lambda r=rows: spark.createDataFrame(r, BIDS).write.format(
            "delta").mode("append").save(bids.path))
        work = BarrierWork(barrier, 1, 0, source_versions=dict(versions))
        if barrier == 4:
            job.close()
            job = maintainer()  # a restart: only the state's checkpoint and the table are left
        if barrier == 5:  # the state committed the barrier, the table commit never happened
            assert job.keyed is not None
            job.keyed._run(work, {"bids": spark.createDataFrame(rows, BIDS)})
            job.close()
            job = maintainer()
        if barrier == 6:  # the MERGEs were measured dearer than a rewrite: the table is rewritten
            job.costs.probe_every, job.costs.whole_s, job.costs.applied_s = PROBE_EVERY, 0.1, 10.0
        job.process(work)
        got = spark.read.format("delta").option("versionAsOf", completions.seen[barrier]).load(str(warehouse / "stats"))
        assert Counter(tuple(r) for r in got.collect()) == query_at(spark, warehouse, table.query, versions), \
            f"barrier {barrier}"
        assert {"stage", "state work", "state commit", "write"} <= {p.name for p in job.watch.phases()}, f"barrier {barrier}"
    history = DeltaTable.forPath(spark, str(warehouse / "stats")).history().orderBy("version").collect()
    assert [h.operation for h in history] == ["WRITE", "MERGE", "WRITE", "MERGE", "MERGE", "WRITE"]
    modes = [h.operationParameters.get("mode") for h in history]
    assert (modes[0], modes[2], modes[5]) == ("Overwrite", "Append", "Overwrite")  # 3: no group changed
    job.process(BarrierWork(7, 2, 0, source_versions=dict(versions)))  # a revision: a new generation, a new state
    assert sorted(p.name for p in (warehouse / "stats" / STATE_FOLDER).iterdir()) == ["g2-b7"]
    got = spark.read.format("delta").option("versionAsOf", completions.seen[7]).load(str(warehouse / "stats"))
    assert Counter(tuple(r) for r in got.collect()) == query_at(spark, warehouse, table.query, versions)
    job.close()


def test_a_changelog_aggregate_appends_its_groups_compacts_and_reads_as_its_query_everywhere(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(costs, "COMPACT_APPENDS", 3)
    monkeypatch.setattr(costs, "COMPACT_SHARE", 100.0)  # (a tiny table's appends weigh much of it)
    rng = random.Random(11)
    warehouse = tmp_path / "wh"
    path = str(warehouse / "stats_log")
    bids = DeltaSink(spark, str(warehouse / "bids"), "ingest_bids", BIDS)
    table, plan = planned("stats_log", PlanKind.KEYED_AGGREGATE)
    assert plan.changelog and "changelog" in plan.explain()
    readers = [planned("by_parity", PlanKind.AGGREGATE), planned("busy", PlanKind.PROJECTION)]
    completions = {name: Completions() for name in ("stats_log", "by_parity", "busy")}

    def maintainers() -> list[TableMaintainer]:
        """The changelog table (its small files bin-packed after every 2nd commit: a version between
        two barriers), then two tables reading it."""
        return [TableMaintainer(spark, t, p, f"maintain_{t.name}", lambda name: str(warehouse / name),
                                completions[t.name], costs=CostChoice(probe_every=1),  # type: ignore[arg-type]
                                compact_every=2 if t is table else 0)
                for t, p in [(table, plan), *readers]]

    versions: dict[str, int] = {}
    jobs = maintainers()
    for barrier in range(1, 9):  # bids on new and old auctions; barrier 3's change no group
        rows = [(rng.randrange(1, barrier * 10 + 10), rng.randrange(-5, 200) if barrier != 3 else -1) for _ in range(30)]
        versions["bids"] = bids.commit(barrier, 1, lambda r=rows: spark.createDataFrame(r, BIDS).write.format(
            "delta").mode("append").save(bids.path))
        if barrier == 6:
            for job in jobs:
                job.close()
            jobs = maintainers()  # a restart: the appends so far are counted from the commits' metadata
        jobs[0].process(BarrierWork(barrier, 1, 0, source_versions=dict(versions)))
        expected = query_at(spark, warehouse, table.query, versions)
        version = completions["stats_log"].seen[barrier]
        assert Counter(tuple(r) for r in visible(read_version(spark, path, version)).collect()) == expected, barrier
        light = run_query("SELECT * FROM stats_log", {"stats_log": DeltaTable_(path, version=version)})
        assert Counter(tuple(r.values()) for r in light.to_pylist()) == expected, f"barrier {barrier} (DataFusion)"
        # the readers follow its changes through its compaction (barrier 6) and its bin-packing (a
        # version between two barriers) with the state they started with
        for job, (reader, _) in zip(jobs[1:], readers, strict=True):
            job.process(BarrierWork(barrier, 1, 0, source_versions={"stats_log": version}))
            assert job.recomputed == (barrier == 1), barrier  # (else its changes applied)
            got = read_version(spark, str(warehouse / reader.name), completions[reader.name].seen[barrier])
            assert Counter(tuple(r) for r in visible(got).collect()) == \
                query_at(spark, warehouse, reader.query, {"stats_log": version}), f"{reader.name}, barrier {barrier}"
            assert sorted(p.name for p in (warehouse / reader.name / STATE_FOLDER / "stats_log").iterdir()) == ["g1-b1"]
    history = DeltaTable.forPath(spark, path).history().orderBy("version").collect()
    assert "OPTIMIZE" in [h.operation for h in history]
    modes = [h.operationParameters.get("mode") for h in history if h.operation == "WRITE"]
    # the rebuild; appends (barrier 3's changes nothing, so counts none); after the 3rd, across the
    # restart (counted from the commits' metadata), a compaction
    assert modes == ["Overwrite", "Append", "Append", "Append", "Append", "Overwrite", "Append", "Append"], modes
    stored = spark.read.format("delta").option("versionAsOf", completions["stats_log"].seen[8]).load(path)
    assert stored.count() > len(query_at(spark, warehouse, table.query, versions))  # the older rows are stored, not read
    for job in jobs:
        job.close()


def test_keyed_top_ns_equal_their_query_through_ties_nulls_a_restart_and_a_compaction(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(costs, "COMPACT_APPENDS", 3)
    monkeypatch.setattr(costs, "COMPACT_SHARE", 100.0)
    rng = random.Random(13)
    warehouse = tmp_path / "wh"
    bids = DeltaSink(spark, str(warehouse / "bids"), "ingest_bids", BIDS)
    tables = [planned(name, PlanKind.KEYED_AGGREGATE) for name in ("top", "top_log")]
    completions = {name: Completions() for name in ("top", "top_log")}

    def maintainers() -> list[TableMaintainer]:  # (top MERGEs at every barrier, whatever it costs)
        return [TableMaintainer(spark, table, plan, f"maintain_{table.name}", lambda name: str(warehouse / name),
                                completions[table.name], **({"rewrite_limit_bytes": -1, "costs": CostChoice(probe_every=1)}
                                                            if table.name == "top" else {}))  # type: ignore[arg-type]
                for table, plan in tables]

    versions: dict[str, int] = {}
    jobs = maintainers()
    for barrier in range(1, 6):  # new and old auctions' bids, with equal prices and no price at all
        rows = [(rng.randrange(1, barrier * 5 + 5), rng.choice([None, *range(-2, 30)])) for _ in range(30)]
        versions["bids"] = bids.commit(barrier, 1, lambda r=rows: spark.createDataFrame(r, BIDS).write.format(
            "delta").mode("append").save(bids.path))
        if barrier == 4:
            for job in jobs:
                job.close()
            jobs = maintainers()  # a restart: the states carry on from their checkpoints
        for job, (table, _) in zip(jobs, tables, strict=True):
            job.process(BarrierWork(barrier, 1, 0, source_versions=dict(versions)))
            path, version = str(warehouse / table.name), completions[table.name].seen[barrier]
            expected = query_at(spark, warehouse, table.query, versions)
            assert Counter(tuple(r) for r in visible(read_version(spark, path, version)).collect()) == expected, \
                f"{table.name} at barrier {barrier}"
    history = DeltaTable.forPath(spark, str(warehouse / "top")).history().orderBy("version").collect()
    assert [h.operation for h in history] == ["WRITE", "MERGE", "MERGE", "MERGE", "MERGE"]
    log = DeltaTable.forPath(spark, str(warehouse / "top_log")).history().orderBy("version").collect()
    assert [h.operationParameters.get("mode") for h in log] == ["Overwrite", "Append", "Append", "Append", "Overwrite"]
    for job in jobs:
        job.close()

