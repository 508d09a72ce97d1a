"""Incremental maintenance against real Delta tables, checked barrier by barrier against plain Python.

The sources get random inserts, updates and deletes (with NULLs in group and join keys); after
each barrier every maintained table must equal its query computed in Python over the sources'
rows at that barrier. A maintainer rebuilt mid-way (a restart) must carry on from the table's
own commit metadata.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from coordinator.domain.work import BarrierWork
from spark_jobs.planning.pipeline import joined, load_pipeline, parse_pipeline
from spark_jobs.planning.plan import PlanKind
from spark_jobs.planning.plans import plan_for, plan_query, shapes_of
from spark_jobs.runtime.commits import DeltaSink
from spark_jobs.runtime.costs import CostChoice
from spark_jobs.runtime.delta_log import read_version
from spark_jobs.runtime.ivm import TableMaintainer
from spark_jobs.runtime.maintenance import writes
from spark_jobs.runtime.maintenance.table import REWRITE_LIMIT_BYTES
from tests.support.oracles import EVERYTHING, ORDERS, QUERIES, USERS, Row, derived_sql, normalise

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass
class Completions:
    """Stands in for the Kafka publisher (its own tests are against a real broker)."""

    seen: dict[tuple[str, int], int] = field(default_factory=dict)

    def publish(self, job_id: str, table: str, barrier: int, generation: int, version: int, *args: Any, **kw: Any) -> None:
        self.seen[(table, barrier)] = version


def test_every_operator_matches_python_under_inserts_updates_and_deletes(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(7)
    warehouse = tmp_path / "wh"
    # every table compacts its small files every 2nd commit: maintenance must read through that
    orders = DeltaSink(spark, str(warehouse / "orders"), "ingest_orders", ORDERS, compact_every=2)
    users = DeltaSink(spark, str(warehouse / "users"), "ingest_users", USERS, compact_every=2)
    pipeline = parse_pipeline(
        f"CREATE TABLE orders ({ORDERS}) WITH ('source'='kafka:o', 'primary_key'='oid');\n"
        f"CREATE TABLE users ({USERS}) WITH ('source'='kafka:u', 'primary_key'='id');\n"
        + derived_sql({**QUERIES, **EVERYTHING})
    )
    shapes = shapes_of([(t.name, t.primary_key) for t in pipeline.roots], [(t.name, t.query) for t in pipeline.derived])
    plans = {t.name: plan_query(t.query, shapes) for t in pipeline.derived}
    assert {n: p.kind for n, p in plans.items()} == {
        "big_orders": "projection", "per_user": "aggregate", "named_orders": "join",
        "per_region": "join_aggregate", "mean_amount": "groups", "everything": "aggregate",
        "overall_mean": "full_refresh",
    }
    completions = Completions()

    def maintainers() -> dict[str, TableMaintainer]:
        return {t.name: TableMaintainer(spark, t, plans[t.name], f"maintain_{t.name}", lambda name: str(warehouse / name),
                                        completions, compact_every=2, costs=CostChoice(probe_every=1))  # type: ignore[arg-type]
                for t in pipeline.derived}

    running = maintainers()
    state: dict[str, dict[int, Row]] = {"orders": {}, "users": {}}
    versions = {"orders": 0, "users": 0}

    def change(table: DeltaSink, rows: dict[int, Row], ddl: str, make: Callable[[int], Row], barrier: int, n: int,
               keys: int) -> int:
        upserts: dict[int, Row] = {}
        deletes: set[int] = set()
        for _ in range(n):
            key = rng.randrange(keys)
            if key in rows and rng.random() < 0.3:
                deletes.add(key)
                upserts.pop(key, None)
                rows.pop(key)
            else:
                rows[key] = upserts[key] = make(key)
                deletes.discard(key)
        frame = spark.createDataFrame(
            [(*r, False) for r in upserts.values()] + [(k, *[None] * (len(ddl.split(",")) - 1), True) for k in deletes],
            f"{ddl}, gone BOOLEAN",
        )
        first = ddl.split()[0]

        def write() -> None:
            (DeltaTable.forPath(spark, table.path).alias("t").merge(frame.alias("s"), f"t.{first} = s.{first}")
             .whenMatchedDelete("s.gone").whenMatchedUpdateAll().whenNotMatchedInsert("NOT s.gone", {
                 c.split()[0]: f"s.{c.split()[0]}" for c in ddl.split(", ")}).execute())

        return table.commit(barrier, 1, write)

    for barrier in range(1, 6):
        if barrier != 4 and rng.random() < 0.9:  # barrier 4 changes no source
            versions["orders"] = change(orders, state["orders"], ORDERS, lambda k: (
                k, rng.choice([1, 2, 3, 4, None]), rng.randrange(10), rng.choice([1.5, 2.0, None]),
                rng.choice(["a", "b", None])), barrier, 25, 30)
        if barrier in (1, 3, 6):
            versions["users"] = change(users, state["users"], USERS, lambda k: (
                k, f"user{k}", rng.choice(["north", "south", None])), barrier, 4, 6)
        if barrier == 5:
            running = maintainers()  # a restart: nothing kept in memory
        for name, maintainer in running.items():
            # odd barriers MERGE the changed rows, even ones rewrite the (small) table whole
            maintainer.rewrite_limit_bytes = -1 if barrier % 2 else REWRITE_LIMIT_BYTES
            sources = {s: versions[s] for s in plans[name].sources}
            maintainer.process(BarrierWork(barrier, 1, 0, source_versions=sources))
            got = spark.read.format("delta").option("versionAsOf", completions.seen[(name, barrier)]).load(
                str(warehouse / name))
            visible = [c for c in got.columns if not c.startswith("__lockstep_")]
            expected = {**QUERIES, **EVERYTHING}[name][1](state["orders"], state["users"])
            assert normalise([tuple(r) for r in got.select(*visible).collect()]) == normalise(expected), (name, barrier)
    history = DeltaTable.forPath(spark, str(warehouse / "per_user")).history().collect()
    merged = {int(r["userMetadata"].split('"barrier": ')[1].split(",")[0]) for r in history if r["operation"] == "MERGE"}
    assert merged and all(b % 2 for b in merged)  # computed once, then maintained both ways
    for maintainer in running.values():
        maintainer.maintained.sink.close()  # the upkeep after the last commit (a compaction) done
    compacted = {name for name in plans if any(
        r["operation"] == "OPTIMIZE" for r in DeltaTable.forPath(spark, str(warehouse / name)).history().collect())}
    # compacted on the way (a small table's rewrite is one file; a join's table is compacted only
    # where a compaction finds more than one file, which depends on how its MERGEs wrote them)
    assert "big_orders" in compacted
    assert completions.seen[("per_user", 4)] == completions.seen[("per_user", 3)]  # no change, same version
    assert running["per_user"].costs.whole_s is not None  # measured before the restart, kept in the commits


@dataclass(frozen=True)
class Root:
    """A keyed root table of an oracle test: its DDL (key first), how many keys, a random row."""

    ddl: str
    keys: int
    row: Callable[[random.Random, int], Row]
    changes: int = 30  # random upserts and deletes per barrier
    keyed: bool = True  # else it only grows (no primary key): new rows only


def maintained_equal_their_queries(spark: SparkSession, warehouse: Path, rng: random.Random, roots: dict[str, Root],
                                   queries: dict[str, tuple[str, str]],
                                   emptied: Callable[[int, str, Row], bool] = lambda b, t, r: False,
                                   python: str = "") -> dict[str, TableMaintainer]:
    """Maintain ``queries`` (name -> SQL, the plan kind it must get) over randomly changed
    ``roots`` for four barriers: the first computed whole, the second's changes applied by a
    rewrite, the third a revision (a new generation: recomputed) after a restart, the fourth's
    changes MERGEd after another restart (from the revised table's commits). After each, every
    table must hold the rows of its query run by Spark over the same snapshots, as a multiset
    (table EXCEPT ALL query and query EXCEPT ALL table both empty). ``emptied(barrier, table,
    row)`` deletes rows besides the random ones. ``python``: a Python pipeline file whose tables
    replace the queries of the same names, which are then what their rows must equal. Returns
    the maintainers as they ended."""
    sinks = {n: DeltaSink(spark, str(warehouse / n), f"ingest_{n}", r.ddl) for n, r in roots.items()}
    key = {n: (r.ddl.split()[0],) if r.keyed else () for n, r in roots.items()}
    options = {n: f"'source'='kafka:{n}'" + (f", 'primary_key'='{key[n][0]}'" if key[n] else "") for n in roots}
    functions = warehouse.parent / "functions.py"
    functions.write_text(python)
    in_python = [load_pipeline(functions)] if python else []
    defined = {t.name for p in in_python for t in p.derived}
    pipeline = joined([parse_pipeline("\n".join(
        [f"CREATE TABLE {n} ({r.ddl}) WITH ({options[n]});" for n, r in roots.items()]
        + [f"CREATE TABLE {n} AS {q};" for n, (q, _) in queries.items() if n not in defined])), *in_python])
    plans = {t.name: plan_for(pipeline, t) for t in pipeline.derived}
    assert {n: str(p.kind) for n, p in plans.items()} == {n: kind for n, (_, kind) in queries.items()}
    completions = Completions()

    def maintainers() -> dict[str, TableMaintainer]:
        # the changes are applied at every barrier, whatever that costs against recomputing (the paths under test)
        return {t.name: TableMaintainer(spark, t, plans[t.name], f"maintain_{t.name}", lambda name: str(warehouse / name),
                                        completions, costs=CostChoice(probe_every=1))  # type: ignore[arg-type]
                for t in pipeline.derived}

    running = maintainers()
    rows: dict[str, dict[int, Row]] = {n: {} for n in roots}
    versions = dict.fromkeys(roots, 0)
    filled: set[str] = set()
    for barrier in range(1, 5):
        for name, root in roots.items():
            if barrier in (2, 3) and rng.random() < 0.25:
                continue  # this table does not change at this barrier (every one changes at the MERGE's)
            if not root.keyed:  # new rows only, appended
                frame = spark.createDataFrame([root.row(rng, 0) for _ in range(root.changes)], root.ddl)
                versions[name] = sinks[name].commit(barrier, 1, lambda f=frame, n=name: (  # type: ignore[misc]
                    f.write.format("delta").mode("append").save(sinks[n].path)))
                continue
            table, upserts = rows[name], {}
            deletes = {k for k, r in table.items() if emptied(barrier, name, r)}
            for _ in range(root.changes):
                key = rng.randrange(root.keys)
                if key in table and rng.random() < 0.25:
                    deletes.add(key)
                    upserts.pop(key, None)
                else:
                    table[key] = upserts[key] = root.row(rng, key)
                    deletes.discard(key)
            for key in deletes:
                table.pop(key, None)
            columns = [c.split()[0] for c in root.ddl.split(", ")]
            frame = spark.createDataFrame([(*r, False) for r in upserts.values()]
                                          + [(k, *[None] * (len(columns) - 1), True) for k in deletes],
                                          f"{root.ddl}, gone BOOLEAN")
            versions[name] = sinks[name].commit(barrier, 1, lambda f=frame, n=name, c=columns: (  # type: ignore[misc]
                DeltaTable.forPath(spark, sinks[n].path).alias("t").merge(f.alias("s"), f"t.{c[0]} = s.{c[0]}")
                .whenMatchedDelete("s.gone").whenMatchedUpdateAll()
                .whenNotMatchedInsert("NOT s.gone", {x: f"s.{x}" for x in c}).execute()))
        if barrier >= 3:
            running = maintainers()  # a restart: nothing kept in memory
        generation = 1 if barrier < 3 else 2  # revised from barrier 3 (as `lockstep revise` does)
        for name, maintainer in running.items():
            maintainer.rewrite_limit_bytes = REWRITE_LIMIT_BYTES if barrier == 2 else -1  # rewrite, else MERGE
            maintainer.process(BarrierWork(barrier, generation, 0,
                                           source_versions={s: versions[s] for s in plans[name].sources}))
            got = spark.read.format("delta").option("versionAsOf", completions.seen[(name, barrier)]).load(
                str(warehouse / name))
            got = got.select(*[c for c in got.columns if not c.startswith("__lockstep_")])
            if barrier == 3:  # the revision: the table recomputed whole, in the new generation
                (last,) = DeltaTable.forPath(spark, str(warehouse / name)).history(1).collect()
                assert (last["operation"], '"generation": 2' in last["userMetadata"]) == ("WRITE", True), name
            for source in plans[name].sources:  # (the maintainers bind the sources to what they read: bind again)
                read_version(spark, sinks[source].path, versions[source]).createOrReplaceTempView(source)
            # as multisets: both directions of EXCEPT ALL are empty (compared here, the tables are small)
            have, want = Counter(got.collect()), Counter(spark.sql(queries[name][0]).collect())
            assert have == want, (name, barrier, have - want, want - have)
            if have:
                filled.add(name)
    assert filled == set(queries)  # every table held rows at some barrier: the comparisons compared something
    return running


BIDS = "bid_id BIGINT, auction BIGINT, bidder BIGINT, price DOUBLE, ts TIMESTAMP"


def bid(rng: random.Random, key: int) -> Row:
    """Auctions 0-3 or none; prices in halves (exact sums); some timestamps 40 s late."""
    second = rng.randrange(60) if rng.random() < 0.8 else rng.randrange(60) - 40
    return (key, rng.choice([0, 1, 2, 3, None]), rng.randrange(8), rng.randrange(20) / 2,
            datetime(2026, 1, 1, 0, 1, 0) + timedelta(seconds=second))


def test_grouped_shapes_equal_their_query_over_each_snapshot(spark: SparkSession, tmp_path: Path) -> None:
    """Top-N, HAVING, DISTINCT, CTEs, time windows, groups by an expression and over a generator's
    rows, aggregates without GROUP BY (one over no rows at all), under inserts, updates (rows
    moving between groups, late timestamps) and deletes (a group emptied, then refilled), NULL
    groups."""
    rng = random.Random(11)
    gone = rng.choice([0, 1, 2])
    maintained_equal_their_queries(spark, tmp_path / "wh", rng, {"bids": Root(BIDS, 60, bid)}, {
        "top_bids": ("SELECT * FROM (SELECT auction, bid_id, price, ROW_NUMBER() OVER (PARTITION BY auction "
                     "ORDER BY price DESC, bid_id) AS rn FROM bids) WHERE rn <= 3", "groups"),
        "busy_auctions": ("SELECT auction, COUNT(*) AS n, SUM(price) AS total FROM bids GROUP BY auction "
                          "HAVING COUNT(*) > 2", "groups"),
        "dear_bidders": ("WITH dear AS (SELECT * FROM bids WHERE price > 5) SELECT auction, COUNT(DISTINCT bidder) "
                         "AS bidders FROM dear GROUP BY auction", "groups"),
        "sliding": ("SELECT window(ts, '20 seconds', '10 seconds') AS w, auction, COUNT(*) AS n FROM bids "
                    "GROUP BY window(ts, '20 seconds', '10 seconds'), auction HAVING COUNT(*) >= 2", "groups"),
        "tumbling": ("SELECT window(ts, '10 seconds') AS w, auction, COUNT(*) AS n, MAX(price) AS top FROM bids "
                     "GROUP BY window(ts, '10 seconds'), auction", "aggregate"),
        "pairs": ("SELECT DISTINCT bidder, auction FROM bids WHERE price > 2", "aggregate"),
        "busy_minutes": ("SELECT minute, COUNT(*) AS n FROM (SELECT date_trunc('MINUTE', ts) AS minute, bidder FROM bids "
                        "WHERE auction > 0) GROUP BY minute HAVING COUNT(DISTINCT bidder) > 3", "groups"),
        "either_side": ("SELECT x, COUNT(*) AS n, SUM(price) AS total FROM bids LATERAL VIEW explode(array(auction, "
                        "bidder)) e AS x GROUP BY x", "aggregate"),  # a generator's rows carry their row's weight
        # without GROUP BY: one row, kept by the changes, also over no rows (COUNT 0, the others NULL)
        "all_bids": ("SELECT COUNT(*) AS n, SUM(price) AS total, AVG(price) AS mean, MIN(price) AS low, "
                     "MAX(price) AS top, COUNT(DISTINCT bidder) AS bidders FROM bids", "aggregate"),
        "gone_bids": (f"SELECT COUNT(*) AS n, COUNT(price) AS priced, SUM(price) AS total, MAX(price) AS top FROM bids "
                      f"WHERE auction = {gone}", "aggregate"),
        "no_bids": ("SELECT COUNT(*) AS n, SUM(price) AS total, MIN(ts) AS first FROM bids WHERE price > 100",
                    "aggregate"),
    }, emptied=lambda barrier, table, row: barrier == 2 and row[1] == gone)  # auction `gone` loses every bid
    history = DeltaTable.forPath(spark, str(tmp_path / "wh" / "top_bids")).history().collect()
    assert {r["operation"] for r in history} >= {"MERGE", "WRITE"}  # maintained both ways after the first


def test_joins_equal_their_query_over_each_snapshot(spark: SparkSession, tmp_path: Path) -> None:
    """A star (bids with their auction, bidder and category), a chain (bids -> auctions ->
    sellers) grouped, groups over joins (each auction's winning bid; bids at their auction's top
    price), a UNION ALL of joins and a projection, an aggregate over a UNION ALL, and LEFT joins of
    four and three tables (star and chain, one grouped with HAVING), every table changing (join
    keys too, some NULL) barrier after barrier."""
    maintained_equal_their_queries(spark, tmp_path / "wh", random.Random(5), {
        "bids": Root(BIDS, 60, bid),
        "auctions": Root("id BIGINT, seller BIGINT, category BIGINT", 5, lambda r, k: (
            k, r.choice([0, 1, 2, 3, None]), r.choice([0, 1, 2, None])), changes=3),
        "persons": Root("id BIGINT, city STRING", 8, lambda r, k: (k, r.choice(["Oslo", "Lima", None])), changes=4),
        "categories": Root("id BIGINT, label STRING", 3, lambda r, k: (k, r.choice(["art", "cars"])), changes=2),
    }, {
        "star": ("SELECT b.bid_id, a.id AS auction_id, p.id AS bidder_id, c.id AS category_id, p.city, c.label, "
                 "b.price FROM bids b JOIN auctions a ON b.auction = a.id JOIN persons p ON b.bidder = p.id "
                 "JOIN categories c ON a.category = c.id", "join"),
        "seller_cities": ("SELECT p.city, COUNT(*) AS n, SUM(b.price) AS total, MAX(b.price) AS top FROM bids b "
                          "JOIN auctions a ON b.auction = a.id JOIN persons p ON a.seller = p.id GROUP BY p.city",
                          "join_aggregate"),
        "sold_bids": ("SELECT COUNT(*) AS n, SUM(b.price) AS total, MIN(b.price) AS low FROM bids b JOIN auctions a "
                      "ON b.auction = a.id WHERE a.seller IS NOT NULL", "join_aggregate"),
        "winning_bids": ("SELECT * FROM (SELECT a.id AS auction_id, a.seller, b.bid_id, b.price, ROW_NUMBER() OVER "
                         "(PARTITION BY a.id ORDER BY b.price DESC, b.bid_id) AS rn FROM auctions a JOIN bids b "
                         "ON a.id = b.auction) WHERE rn = 1", "groups"),
        "top_bids": ("SELECT b.auction, b.bid_id, b.price FROM bids b JOIN (SELECT auction, MAX(price) AS top "
                     "FROM bids GROUP BY auction) m ON b.auction = m.auction AND b.price = m.top", "groups"),
        "cities": ("SELECT 'bid' AS what, b.bid_id AS id, p.city FROM bids b JOIN persons p ON b.bidder = p.id "
                   "UNION ALL SELECT 'auction', a.id, p.city FROM auctions a JOIN persons p ON a.seller = p.id "
                   "UNION ALL SELECT 'person', id, city FROM persons WHERE city IS NOT NULL", "union"),
        "left_star": ("SELECT b.bid_id, b.price, a.seller, p.city, c.label FROM bids b LEFT JOIN auctions a "
                      "ON b.auction = a.id LEFT JOIN persons p ON b.bidder = p.id LEFT JOIN categories c "
                      "ON a.category = c.id", "groups"),
        "left_chain": ("SELECT b.auction, b.price, p.city FROM bids b LEFT JOIN auctions a ON b.auction = a.id "
                       "LEFT JOIN persons p ON a.seller = p.id WHERE b.price > 1", "groups"),
        "left_grouped": ("SELECT b.bidder, p.city, COUNT(*) AS n, SUM(b.price) AS total, MAX(c.label) AS label FROM "
                         "bids b LEFT JOIN auctions a ON b.auction = a.id LEFT JOIN persons p ON a.seller = p.id LEFT "
                         "JOIN categories c ON a.category = c.id GROUP BY b.bidder, p.city HAVING COUNT(*) >= 2",
                         "groups"),
        "mentions": ("SELECT k, COUNT(*) AS n, MAX(price) AS top FROM (SELECT auction AS k, price FROM bids "
                     "UNION ALL SELECT id, NULL FROM auctions WHERE seller IS NOT NULL) u GROUP BY k", "groups"),
    })


def test_distinct_counts_over_a_table_that_only_grows_count_each_new_value(spark: SparkSession, tmp_path: Path) -> None:
    """A new row can add a distinct value to its group even where it can lose no extreme value:
    COUNT(DISTINCT) over an append-only source is recomputed for the changed groups."""
    maintained_equal_their_queries(spark, tmp_path / "wh", random.Random(5), {
        "bids": Root(BIDS, 0, bid, changes=20, keyed=False),
    }, {"bidders": ("SELECT auction, COUNT(DISTINCT bidder) AS bidders, MIN(price) AS low, MAX(price) AS high, "
                    "COUNT(*) AS n FROM bids GROUP BY auction", "aggregate")})


def test_an_expression_over_aggregates_of_a_table_that_only_grows_stays_its_one_row(
        spark: SparkSession, tmp_path: Path) -> None:
    """Without GROUP BY, ``SUM(price) / COUNT(*)`` is one row over every bid so far: recomputed.
    It was once planned as a projection of each barrier's new bids, whose query Spark refuses
    (MISSING_GROUP_BY): the table's job failed at every barrier."""
    maintained_equal_their_queries(spark, tmp_path / "wh", random.Random(6), {
        "bids": Root(BIDS, 0, bid, changes=20, keyed=False),
    }, {"mean_price": ("SELECT SUM(price) / COUNT(*) AS mean, COALESCE(MAX(price), 0) AS top FROM bids", "full_refresh"),
        "bids_seen": ("SELECT COUNT(*) AS n, SUM(price) AS total FROM bids", "aggregate")})


NEXMARK = Path(__file__).parents[3] / "pipelines" / "nexmark.sql"


def test_nexmark_queries_equal_their_query_over_each_snapshot(spark: SparkSession, tmp_path: Path) -> None:
    """Queries of pipelines/nexmark.sql (groups by window, over a join and over joins whose rows
    have no key, an aggregate with FILTER clauses) over people and auctions that change and
    bids that only grow."""
    queries = {t.name: t.query for t in parse_pipeline(NEXMARK.read_text()).derived}
    start = datetime(2026, 1, 1, 23, 59, 50)

    def at(rng: random.Random) -> datetime:
        return start + timedelta(seconds=rng.randrange(30))  # across midnight: two days

    maintained_equal_their_queries(spark, tmp_path / "wh", random.Random(3), {
        "person": Root("id BIGINT, name STRING, email_address STRING, credit_card STRING, city STRING, state STRING, "
                       "date_time TIMESTAMP, extra STRING", 9, lambda r, k: (
                           k, r.choice(["ann", "bo"]), "", "", "Bend", "OR", at(r), ""), changes=4),
        "auction": Root("id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, reserve BIGINT, "
                        "date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra STRING", 6,
                        lambda r, k: (k, f"i{k}", "", 1, 2, start, start + timedelta(seconds=r.choice([10, 40])),
                                      r.randrange(9), r.choice([10, 11]), ""), changes=4),
        "bid": Root("auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, date_time TIMESTAMP, "
                    "extra STRING", 0, lambda r, k: (
                        r.randrange(7), r.randrange(9), r.choice([500, 20000, 2000000]) + r.randrange(3),
                        r.choice(["Apple", "channel-5"]), f"https://x/a/b/c/item.htm?channel_id={r.randrange(3)}",
                        at(r), ""), changes=25, keyed=False),
    }, {name: (queries[name], kind) for name, kind in (
        ("q5", "groups"), ("q7", "groups"), ("q8", "groups"), ("q17", "aggregate"), ("q20", "groups"))})
    # (q9 is the joins' winning_bids; q18 and q19, Top-N per group, the grouped shapes' top_bids)


FUNCTIONS = '''
import pandas as pd
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf, udf
from pyspark.sql.types import DoubleType, StringType

from spark_jobs.api import pipelines as dp


@udf(StringType())
def label(note, amount):
    if amount == 7:
        raise ValueError("seven is unlucky")
    return (note or "none").upper()


@pandas_udf(DoubleType())
def twice(price: pd.Series) -> pd.Series:
    return price * 2


@dp.materialized_view
def labelled(orders):  # row-wise and keeps the key: each barrier replaces the rows of the keys that changed
    return orders.where("price > 1.5").select("oid", "uid", label("note", "amount").alias("label"),
                                              twice("price").alias("twice"))


@dp.materialized_view
def spread(orders):  # a generator: a key may have several rows, so recomputed
    return orders.select("oid", F.explode(F.array("uid", "amount")).alias("x"))


@dp.materialized_view
def renumbered(orders):  # the key computed anew, not kept: recomputed
    return orders.select((F.col("oid") + 0).alias("oid"), "amount")


@dp.materialized_view
def per_user(orders):  # an aggregate over the UDF's values: recomputed, its bad rows found in the whole table
    return orders.withColumn("label", label("note", "amount")).groupBy("uid").agg(F.count("label").alias("n"))
'''


def test_python_tables_over_a_keyed_source_equal_their_function_over_each_snapshot(
        spark: SparkSession, tmp_path: Path) -> None:
    """A row-wise function that keeps its source's key is maintained from the changed rows, by
    MERGE and by rewrite, under inserts, updates and deletes (rows moving in and out of its
    filter); one that is not (a generator, a key computed anew) is recomputed. Rows the UDF raises
    on are dead letters, also for a recomputed function of one source (kept once, though it is
    recomputed at every barrier), and the rest of their barrier is committed."""
    unlucky = "NOT amount <=> 7"  # the rows the UDF raises on
    running = maintained_equal_their_queries(spark, tmp_path / "wh", random.Random(5), {
        "orders": Root(ORDERS, 40, lambda r, k: (k, r.choice([1, 2, 3, None]), r.randrange(10), r.choice([1.5, 2.0, None]),
                                                r.choice(["a", "b", None]))),
    }, {
        "labelled": ("SELECT oid, uid, UPPER(COALESCE(note, 'none')) AS label, price * 2 AS twice FROM orders "
                     f"WHERE price > 1.5 AND {unlucky}", "row-wise"),
        "spread": ("SELECT oid, x FROM orders LATERAL VIEW explode(array(uid, amount)) e AS x", "row-wise"),
        "renumbered": ("SELECT oid + 0 AS oid, amount FROM orders", "row-wise"),
        "per_user": (f"SELECT uid, COUNT(*) AS n FROM orders WHERE {unlucky} GROUP BY uid", "row-wise"),
    }, python=FUNCTIONS)  # (a plan says row-wise for any function of one keyed source, until its job checks)
    kinds = {name: (m.plan.kind, m.plan.reason) for name, m in running.items()}
    assert kinds["labelled"][0] == PlanKind.ROW_WISE
    assert kinds["spread"][0] == PlanKind.FULL_REFRESH and "generator" in kinds["spread"][1]
    assert kinds["renumbered"][0] == PlanKind.FULL_REFRESH and "key (oid)" in kinds["renumbered"][1]
    assert kinds["per_user"][0] == PlanKind.FULL_REFRESH and "Aggregate" in kinds["per_user"][1]
    operations = [r["operation"] for r in DeltaTable.forPath(spark, str(tmp_path / "wh" / "labelled")).history().collect()]
    assert "MERGE" in operations  # maintained from the changed rows
    for table in ("labelled", "per_user"):
        letters = [(r["row"], r["error"]) for r in spark.read.format("delta").load(str(tmp_path / "wh" / f"{table}__dlq"))
                   .collect()]
        assert letters and {error for _, error in letters} == {"ValueError: seven is unlucky"}, table
        assert all('"amount": 7' in row for row, _ in letters), table
        if table == "per_user":  # a row kept once, however often its table was recomputed
            assert len(set(letters)) == len(letters)


def test_a_table_kept_by_key_is_written_in_key_order_and_a_merge_of_new_keys_opens_only_their_files(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writes, "FILE_ROWS", 1_000)
    warehouse = tmp_path / "wh"
    source = DeltaSink(spark, str(warehouse / "src"), "ingest_src", "k BIGINT, v BIGINT")
    rows = spark.range(20_000).selectExpr("id AS k", "id % 7 AS v").orderBy(F.rand(3))  # written in no order
    version = source.commit(1, 1, lambda: rows.write.format("delta").mode("append").save(source.path))
    pipeline = parse_pipeline("CREATE TABLE src (k BIGINT, v BIGINT) WITH ('source'='kafka:s', 'primary_key'='k');\n"
                              "CREATE TABLE doubled AS SELECT k, v * 2 AS w FROM src WHERE v >= 0;")
    (table,) = pipeline.derived
    plan = plan_query(table.query, shapes_of([("src", ("k",))], []))
    completions = Completions()
    maintainer = TableMaintainer(spark, table, plan, "maintain_doubled", lambda name: str(warehouse / name),
                                 completions, rewrite_limit_bytes=-1, costs=CostChoice(probe_every=1))  # type: ignore[arg-type]
    maintainer.process(BarrierWork(1, 1, 0, source_versions={"src": version}))
    doubled = warehouse / "doubled"
    adds = spark.read.json(str(doubled / "_delta_log" / "00000000000000000000.json")).where("add IS NOT NULL")
    tops = adds.select("add.path", F.get_json_object("add.stats", "$.maxValues.k").cast("long").alias("top")).collect()
    older = [add.path for add in tops if add.top < 19_000]
    assert len(older) >= 18  # each file holds a run of keys (the rows came in no order)
    for path in older:
        (doubled / path).unlink()  # a MERGE that opened one of these files would fail
    changes = spark.createDataFrame([(19_500, 100), (19_990, 101), (20_500, 102)], "k BIGINT, v BIGINT")
    version = source.commit(2, 1, lambda: DeltaTable.forPath(spark, source.path).alias("t").merge(
        changes.alias("s"), "t.k = s.k").whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
    maintainer.process(BarrierWork(2, 1, 0, source_versions={"src": version}))
    newest = spark.read.format("delta").load(str(doubled)).where("k >= 19000")
    assert newest.count() == 1_001
    assert {r.k: r.w for r in newest.where("k IN (19500, 19990, 20500)").collect()} == {19_500: 200, 19_990: 202, 20_500: 204}
