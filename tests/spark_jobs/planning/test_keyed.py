"""WITH ('state' = 'keyed'): which queries Spark's state store keeps by key (a join of two
tables, a GROUP BY or a Top-N of one table that only grows or is a keyed join's), and a refusal that says why for any other
(the option is never silently ignored); a Top-N's streaming query, made once its ORDER BY's
types are known."""

from __future__ import annotations

import pytest

from coordinator.domain.snapshot import HIDDEN
from spark_jobs.planning.keyed import top_n_query
from spark_jobs.planning.pipeline import Pipeline, PipelineError, parse_pipeline
from spark_jobs.planning.plans import plan_for

ROOTS = ("CREATE TABLE bids (auction BIGINT, price BIGINT, day STRING) WITH ('source' = 'kafka:b');\n"
         "CREATE TABLE auctions (id BIGINT, category BIGINT) WITH ('source' = 'kafka:a', 'primary_key' = 'id');\n")


def keyed(query: str) -> Pipeline:
    return parse_pipeline(ROOTS + f"CREATE TABLE t WITH ('state' = 'keyed') AS {query}")


def test_a_keyed_join_keeps_each_sides_rows_by_join_key() -> None:
    pipeline = keyed("SELECT b.price, a.category FROM bids b JOIN auctions a ON b.auction = a.id WHERE a.category = 10")
    plan = plan_for(pipeline, pipeline.table("t"))
    assert (plan.kind, plan.sources, plan.append_only, plan.keyed) == ("keyed_join", ("auctions", "bids"), True, True)
    assert plan.join_columns == {"bids": ("auction",), "auctions": ("id",)}
    assert plan.explain().startswith("incremental keyed join: INNER equi-join on bids.auction = auctions.id")
    assert f"GREATEST(b.{HIDDEN}barrier, a.{HIDDEN}barrier) AS {HIDDEN}barrier FROM bids" in plan.change_query


def test_a_keyed_aggregate_keeps_each_groups_running_aggregates_by_its_group_columns() -> None:
    pipeline = keyed("SELECT day, auction, COUNT(*) AS n, COUNT(*) FILTER (WHERE price < 10) AS cheap, "
                     "MIN(price) AS low, AVG(price) AS mean FROM bids WHERE price > 0 GROUP BY auction, day")
    plan = plan_for(pipeline, pipeline.table("t"))
    assert (plan.kind, plan.sources, plan.key, plan.append_only) == ("keyed_aggregate", ("bids",), (0, 1), False)
    assert plan.explain().startswith("incremental keyed aggregate: GROUP BY auction, day of bids, which only grows, "
                                     "with COUNT(*), COUNT, MIN, AVG")
    assert plan.change_query.endswith(f"MAX({HIDDEN}barrier) AS {HIDDEN}barrier FROM bids WHERE price > 0 "
                                      "GROUP BY auction, day")


def test_a_keyed_top_n_keeps_each_partitions_first_rows_keyed_by_partition_and_rank() -> None:
    pipeline = keyed("SELECT auction, r, price FROM (SELECT day, auction, price, ROW_NUMBER() OVER (PARTITION BY "
                     "auction ORDER BY price DESC, day NULLS LAST) AS r FROM bids b WHERE price > 0) WHERE r < 4")
    plan = plan_for(pipeline, pipeline.table("t"))
    assert (plan.kind, plan.sources, plan.key, plan.change_query) == ("keyed_aggregate", ("bids",), (0, 1), "")
    assert plan.explain().startswith("incremental keyed aggregate: the first 3 rows of each (auction) of bids")
    assert plan.top_n is not None and plan.top_n.columns == (("auction", "auction"), ("r", None), ("price", "price"))
    query = top_n_query(plan.top_n, {"price": "bigint", "day": "string"})  # (max_by would reverse the string day)
    assert query.startswith(f"SELECT {HIDDEN}row.auction AS auction, {HIDDEN}rank + 1 AS r, {HIDDEN}row.price AS price")
    assert ("min_by(named_struct('auction', auction, 'price', price), struct(price IS NULL, ~(price), "
            "day IS NULL, day), 3)") in query and "FROM bids AS b WHERE price > 0 GROUP BY auction" in query
    assert "max_by(named_struct('auction', auction, 'price', price), struct(price IS NOT NULL, price, day IS NOT NULL, " \
        "concat(unhex(translate(hex(encode(day, 'UTF-8'))" in top_n_query(plan.top_n, {"price": "string", "day": "string"})
    with pytest.raises(PipelineError, match=r"orders by price, day, whose types \(array<int>, array<int>\) cannot all"):
        top_n_query(plan.top_n, {"price": "array<int>", "day": "array<int>"})


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("SELECT * FROM (SELECT auction, price, RANK() OVER (PARTITION BY auction ORDER BY price) AS r FROM bids) "
         "WHERE r <= 3", "not one ROW_NUMBER"),
        ("SELECT * FROM (SELECT auction, price, ROW_NUMBER() OVER (ORDER BY price) AS r FROM bids) WHERE r <= 3",
         "not one ROW_NUMBER"),
        ("SELECT * FROM (SELECT auction, price, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price) AS r FROM bids) "
         "WHERE r <= 3 AND price > 1", "outer WHERE is not r <= N"),
        ("SELECT price, r FROM (SELECT auction, price, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price) AS r "
         "FROM bids) WHERE r <= 3", "does not hold every PARTITION BY column and r"),
        ("SELECT * FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY category ORDER BY id) AS r FROM auctions) "
         "WHERE r = 1", "auctions may update or delete rows"),
        ("SELECT b.price FROM bids b LEFT JOIN auctions a ON b.auction = a.id", "not an INNER equi-join of two tables"),
        ("SELECT b.price FROM bids b JOIN auctions a ON b.price > a.id", "no equality between a column of each"),
        ("SELECT price FROM bids", "not an INNER equi-join of two tables"),
        ("SELECT b.price FROM bids b JOIN (SELECT id FROM auctions) a ON b.auction = a.id", "not one SELECT"),
        ("SELECT a.category, COUNT(*) AS n FROM bids b JOIN auctions a ON b.auction = a.id GROUP BY a.category",
         "it aggregates a join"),
        ("SELECT category, COUNT(*) AS n FROM auctions GROUP BY category", "auctions may update or delete rows"),
        ("SELECT auction, COUNT(DISTINCT price) AS n FROM bids GROUP BY auction", "COUNT\\(DISTINCT"),
        ("SELECT auction, SUM(price) AS s FROM bids GROUP BY auction HAVING SUM(price) > 9", "HAVING"),
        ("SELECT COUNT(*) AS n FROM bids", "without GROUP BY"),
        ("SELECT auction, SUM(price) * 2 AS s FROM bids GROUP BY auction", "an expression over aggregates"),
        ("SELECT SUM(price) AS s FROM bids GROUP BY auction", "not in the select list"),
        ("SELECT auction, price, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price) AS r FROM bids", "ranks"),
    ],
)
def test_any_other_query_is_refused_with_why(query: str, why: str) -> None:
    pipeline = keyed(query)
    with pytest.raises(PipelineError, match=f"table t: WITH \\('state' = 'keyed'\\) keeps .*{why}.*; remove the option"):
        plan_for(pipeline, pipeline.table("t"))


JOINED = "SELECT b.auction, b.price, a.category FROM bids b JOIN auctions a ON b.auction = a.id"


@pytest.mark.parametrize(
    ("query", "first"),
    [
        ("SELECT category, COUNT(*) AS n, MAX(price) AS high FROM j GROUP BY category", "GROUP BY category of j"),
        ("SELECT * FROM (SELECT auction, price, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS r "
         "FROM j) WHERE r = 1", "the first row of each (auction) of j"),
    ],
)
def test_keyed_state_reads_a_keyed_joins_table_which_grows_between_its_rebuilds(query: str, first: str) -> None:
    """A join before an aggregate, as two keyed tables: the join's table is appended to except
    when a source's update rebuilds it, and that rebuild rebuilds the aggregate's state too."""
    pipeline = parse_pipeline(ROOTS + f"CREATE TABLE j WITH ('state' = 'keyed') AS {JOINED};\n"
                              f"CREATE TABLE t WITH ('state' = 'keyed') AS {query}")
    plan = plan_for(pipeline, pipeline.table("t"))
    assert (plan.kind, plan.sources) == ("keyed_aggregate", ("j",))
    assert f"{first}, a keyed join's table, which only grows between its rebuilds (each rebuilds this state too)" \
        in plan.explain()
    plain = parse_pipeline(ROOTS + f"CREATE TABLE j AS {JOINED};\nCREATE TABLE t WITH ('state' = 'keyed') AS {query}")
    with pytest.raises(PipelineError, match="j may update or delete rows .* a keyed join's table may be read instead"):
        plan_for(plain, plain.table("t"))  # (the same join kept otherwise retracts rows when auctions change)


def test_a_changelog_aggregate_is_read_by_its_changes_and_the_rows_they_replace() -> None:
    """A table that reads a changelog table is planned as over any table with a key (here an
    aggregate), its changes read another way (``runtime.maintenance.changelog_changes``)."""
    pipeline = parse_pipeline(ROOTS + "CREATE TABLE t WITH ('state' = 'keyed', 'layout' = 'changelog') AS "
                              "SELECT auction, COUNT(*) AS n FROM bids GROUP BY auction;\n"
                              "CREATE TABLE d AS SELECT n, COUNT(*) AS auctions FROM t GROUP BY n;")
    plan = plan_for(pipeline, pipeline.table("t"))
    assert (plan.kind, plan.changelog) == ("keyed_aggregate", True)
    assert "the groups they changed are appended (layout changelog" in plan.explain()
    downstream = plan_for(pipeline, pipeline.table("d"))
    assert (downstream.kind, downstream.changelog, downstream.changelog_sources) == ("aggregate", False, ("t",))
    assert "t in the changelog layout: each barrier's appended rows, with the rows they replace" in downstream.explain()


@pytest.mark.parametrize(
    ("tables", "why"),
    [
        ("CREATE TABLE t WITH ('state' = 'keyed', 'layout' = 'changelog') AS "
         "SELECT b.price, a.category FROM bids b JOIN auctions a ON b.auction = a.id",
         "WITH \\('layout' = 'changelog'\\) is a keyed aggregate's layout"),
        ("CREATE TABLE t WITH ('state' = 'keyed', 'layout' = 'changelog') AS SELECT auction, COUNT(*) AS n FROM bids "
         "GROUP BY auction; CREATE TABLE d WITH ('state' = 'keyed') AS SELECT n, COUNT(*) AS c FROM t GROUP BY n",
         "table d: .* but t has the changelog layout"),
    ],
)
def test_a_changelog_layout_where_it_cannot_hold_is_refused(tables: str, why: str) -> None:
    pipeline = parse_pipeline(ROOTS + tables)
    with pytest.raises(PipelineError, match=why):
        for table in pipeline.derived:
            plan_for(pipeline, table)
