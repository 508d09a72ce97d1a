"""Query analysis: which shape a query has, its key, and why a query falls back to full refresh."""

from __future__ import annotations

import pytest

from coordinator.domain.snapshot import HIDDEN
from spark_jobs.planning.pipeline import parse_pipeline
from spark_jobs.planning.plan import NUMBER, TableShape
from spark_jobs.planning.plans import plan_for, plan_query, shapes_of
from tests.support import ROOT

SHAPES = {
    "shopping": TableShape(None, True),  # append-only root table
    "users": TableShape(("id",), False),
    "orders": TableShape(("oid",), False),
}


@pytest.mark.parametrize(
    ("query", "kind", "key"),
    [
        ("SELECT user_id, item_id, SUM(amount) AS t FROM shopping GROUP BY user_id, item_id", "aggregate", (0, 1)),
        ("SELECT COUNT(*) AS n, region FROM users WHERE id > 2 GROUP BY region", "aggregate", (1,)),
        ("SELECT user_id, price * 2 AS p2 FROM shopping WHERE amount > 1", "projection", None),
        ("SELECT user_id, x FROM shopping LATERAL VIEW explode(array(price, amount)) e AS x", "projection", None),
        ("SELECT u.region, COUNT(*) AS n FROM users u LATERAL VIEW explode(array(u.id, 1)) e AS x GROUP BY u.region",
         "aggregate", (0,)),
        ("SELECT name, id FROM users WHERE id > 3", "projection", (1,)),
        ("SELECT * FROM users", "projection", ("id",)),
        ("SELECT o.oid, u.id, u.name FROM orders o LEFT JOIN users u ON o.uid = u.id", "join", (0, 1)),
        ("SELECT o.oid, u.id FROM orders AS o INNER JOIN users AS u ON o.uid = u.id AND u.id > 0", "join", (0, 1)),
        ("SELECT u.name, SUM(o.total) s, MAX(o.total) m FROM orders o JOIN users u ON o.uid = u.id GROUP BY u.name",
         "join_aggregate", (0,)),
        ("SELECT o.oid, u.name FROM orders o JOIN users u ON o.uid = u.id", "join", (0,)),  # one user per order
        ("SELECT u.region, COUNT(*) AS n FROM shopping s JOIN users u ON s.user_id = u.id JOIN orders o "
         "ON o.uid = u.id GROUP BY u.region", "join_aggregate", (0,)),
    ],
)
def test_incremental_shapes(query: str, kind: str, key: tuple | None) -> None:
    plan = plan_query(query, SHAPES)
    assert (plan.kind, plan.key) == (kind, key)
    assert plan.explain().startswith(f"incremental {kind.replace('_', ' + ')}")
    assert HIDDEN + "w" in plan.change_query or "*" in plan.change_query  # SELECT * carries the weight


@pytest.mark.parametrize(
    ("query", "key", "columns"),
    [
        ("SELECT id, SUM(x) FROM users GROUP BY id HAVING SUM(x) > 1", ("id",), ("id",)),
        ("SELECT uid, SUM(t) / COUNT(*) AS m FROM orders GROUP BY uid", ("uid",), ("uid",)),
        ("SELECT * FROM (SELECT region, name, ROW_NUMBER() OVER (PARTITION BY region ORDER BY name DESC) AS rn "
         "FROM users) WHERE rn <= 3", ("region", "rn"), ("region",)),
        ("WITH r AS (SELECT id, region, RANK() OVER (PARTITION BY region ORDER BY name) AS k FROM users) "
         "SELECT r.id, region, k FROM r WHERE k = 1", ("id",), ("region",)),
        ("SELECT region, COUNT(*) AS names FROM (SELECT DISTINCT region, name FROM users) GROUP BY region",
         ("region",), ("region",)),
        ("SELECT u.region, u.name FROM users u JOIN (SELECT region, MAX(name) AS top FROM users GROUP BY region) m "
         "ON u.region = m.region AND u.name = m.top GROUP BY u.region, u.name", ("region", "name"), ("region",)),
        ("SELECT * FROM (SELECT o.oid, u.id AS uid, o.total, ROW_NUMBER() OVER (PARTITION BY u.id ORDER BY o.total DESC) "
         "AS rn FROM orders o JOIN users u ON o.uid = u.id) WHERE rn = 1", ("uid", "rn"), ("uid",)),
        ("SELECT o.uid, u.name, SUM(o.total) AS t FROM orders o JOIN users u ON o.uid = u.id GROUP BY o.uid, u.name "
         "HAVING SUM(o.total) > 9", ("uid", "name"), ("uid",)),
        ("SELECT o.uid, o.oid, o.total FROM orders o JOIN (SELECT uid, MAX(total) AS top FROM orders GROUP BY uid) m "
         "ON o.uid = m.uid AND o.total = m.top", ("oid",), ("uid",)),  # each order meets one row of m: its key holds
        ("SELECT window(ts, '1 minute', '10 seconds') AS w, region, COUNT(*) AS n FROM users "
         "GROUP BY window(ts, '1 minute', '10 seconds'), region HAVING COUNT(*) > 2", ("w", "region"), ("w", "region")),
        ("SELECT h, COUNT(*) n FROM (SELECT date_trunc('HOUR', ts) AS h FROM users) GROUP BY h HAVING n > 1",
         ("h",), ("h",)),  # an expression of one table's columns groups its rows too
        ("SELECT u.region, u.w FROM (SELECT *, window(ts, '5 seconds') AS w FROM users) u JOIN (SELECT MAX(id) AS top, "
         "window(ts, '5 seconds') AS w FROM users GROUP BY window(ts, '5 seconds')) m ON u.w = m.w AND u.id = m.top",
         ("w", NUMBER), ("w",)),
        ("SELECT k, COUNT(*) AS n FROM (SELECT uid AS k FROM orders UNION ALL SELECT id FROM users) u GROUP BY k",
         ("k",), ("k",)),  # a UNION ALL in FROM: each branch's column holds the group value
        # no columns identify a row: each group's rows are numbered
        ("SELECT o.uid, o.oid FROM orders o JOIN (SELECT uid, note, MAX(total) AS top FROM orders GROUP BY uid, note) m "
         "ON o.uid = m.uid AND o.total = m.top", ("uid", NUMBER), ("uid",)),  # an order may meet several rows of m
        ("SELECT u.id, u.name, s.amount FROM shopping s JOIN users u ON s.user_id = u.id", ("id", NUMBER), ("id",)),
        ("SELECT region, COUNT(*) AS n FROM users GROUP BY region, name HAVING n > 1", ("region", NUMBER),
         ("region",)),  # by region (a coarser group), as name is not selected
    ],
)
def test_queries_maintained_by_group(query: str, key: tuple[str, ...], columns: tuple[str, ...]) -> None:
    plan = plan_query(query, SHAPES)
    assert (plan.kind, plan.key, plan.group_columns) == ("groups", key, columns)
    assert plan.explain().startswith(f"incremental groups: the groups ({', '.join(columns)})")


@pytest.mark.parametrize(
    "query",
    ["SELECT DISTINCT region, name FROM users WHERE id > 2",
     "SELECT window(ts, '10 seconds') AS w, COUNT(*) AS n FROM users GROUP BY window(ts, '10 seconds')",
     "SELECT date_trunc('HOUR', ts) AS h, region, MAX(id) AS m FROM users GROUP BY date_trunc('HOUR', ts), region"],
)
def test_distinct_and_time_windows_are_aggregates(query: str) -> None:
    plan = plan_query(query, SHAPES)
    assert plan.kind == "aggregate" and "GROUP BY" in plan.full_query


@pytest.mark.parametrize(("query", "kind"), [
    ("SELECT COUNT(*) AS n, SUM(id) AS s, MAX(id) AS top FROM users WHERE region = 'eu'", "aggregate"),
    ("SELECT COUNT(*) AS n FROM orders o JOIN users u ON o.user_id = u.id", "join_aggregate"),
])
def test_an_aggregate_without_group_by_is_one_group_kept_by_its_changes(query: str, kind: str) -> None:
    plan = plan_query(query, SHAPES)
    assert (plan.kind, plan.key, plan.one_row) == (kind, (), True)
    assert "its one row (no GROUP BY)" in plan.explain()
    # a table that reads it finds no key to follow its one row by: it is recomputed, as before
    shapes = shapes_of([("users", ("id",)), ("orders", ("oid",))], [("total", query)])
    assert shapes["total"].key is None


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("SELECT name FROM users", "key (id) is not selected"),
        ("SELECT id, COUNT(*) AS n FROM users WHERE id > (SELECT AVG(id) FROM users) GROUP BY id", "outside FROM"),
        ("SELECT * FROM (SELECT id, rank() OVER (PARTITION BY region ORDER BY id) r FROM users) WHERE r < 3",
         "does not select users.region"),
        ("SELECT DISTINCT * FROM (SELECT region, name FROM users)", "share no source column"),
        ("SELECT name, n FROM (SELECT name, COUNT(*) n FROM users GROUP BY name) JOIN "
         "(SELECT region FROM users GROUP BY region) ON n = 1", "share no source column"),
        ("SELECT a.region, a.n FROM (SELECT region, COUNT(*) n FROM users GROUP BY region) a JOIN "
         "(SELECT region, MAX(id) m FROM users GROUP BY region) b ON a.n = b.m", "does not match users.region"),
        ("SELECT id, COUNT(*) OVER w FROM users WINDOW w AS (PARTITION BY id)", "named WINDOW"),
        ("SELECT u.region, MAX(u.id) FROM users u JOIN orders o ON u.id = o.uid GROUP BY u.region HAVING MAX(u.id) > 1",
         "JOIN orders AS o does not match users.region"),
        ("SELECT region, MAX(id) FROM users u JOIN orders o ON u.id = o.uid GROUP BY region HAVING MAX(id) > 1",
         "qualify it"),
        ("SELECT k, COUNT(*) AS n FROM (SELECT uid AS k FROM orders UNION ALL SELECT oid FROM orders) GROUP BY k",
         "orders holds a group value in two columns (oid, uid)"),
        ("SELECT q.region, AVG(q.top) AS a FROM (SELECT u.region, MAX(o.total) AS top FROM users u JOIN orders o "
         "ON u.id = o.uid GROUP BY u.id, u.region) q GROUP BY q.region", "the inner query is a table of its own"),
        ("SELECT id FROM users ORDER BY id", "ORDER BY / LIMIT"),
        ("SELECT id FROM users UNION SELECT oid FROM orders", "UNION (without ALL)"),
        ("SELECT id FROM users UNION ALL SELECT oid FROM orders", "needs a key: select a different constant"),
        ("SELECT 1 AS t, id FROM users UNION ALL SELECT 2, uid FROM orders", "branch 2: orders key (oid) is not"),
        ("SELECT region, COUNT(*) FROM users GROUP BY region UNION ALL SELECT 'x', oid FROM orders", "only projections"),
        ("SELECT a.id FROM users a JOIN users b ON a.id = b.id", "self-joins"),
        ("SELECT o.oid FROM orders o JOIN users u ON uid = id", "qualify both columns"),
        ("SELECT o.oid, u.id FROM orders o RIGHT JOIN users u ON o.uid = u.id", "RIGHT JOIN"),
        ("SELECT o.oid, u.id FROM orders o JOIN users u ON o.uid > u.id", "no equality"),
        ("SELECT id, rank() OVER (ORDER BY id) FROM users", "window"),
        ("SELECT id FROM users WHERE id IN (SELECT uid FROM orders)", "subqueries"),
        ("SELECT u.name, o.total FROM orders o JOIN users u ON o.uid = u.id", "has no key"),  # nor the join column
        ("SELECT u.region, COUNT(*) AS n FROM orders o LEFT JOIN users u ON o.uid = u.id LEFT JOIN shopping s "
         "ON s.user_id = u.id GROUP BY u.region", "group by a column of orders (qualified, e.g. o.column"),
        ("SELECT u.name FROM orders o LEFT JOIN users u ON o.uid = u.id LEFT JOIN shopping s ON s.user_id = u.id",
         "select a column of orders"),
        ("SELECT o.oid FROM orders o JOIN users u ON o.uid = u.id FULL JOIN shopping s ON s.user_id = u.id",
         "FULL JOIN among more than two tables"),
        ("SELECT o.oid FROM orders o JOIN users u ON o.uid = u.id JOIN users v ON v.id = o.oid", "self-joins"),
        ("SELECT o.oid FROM orders o JOIN users u ON o.uid = u.id CROSS JOIN shopping s", "CROSS JOIN"),
        ("SELECT u.id, x FROM users u LATERAL VIEW explode(array(u.id, 1)) e AS x", "LATERAL VIEW EXPLODE makes any"),
        ("SELECT id, explode(array(id, 1)) AS x FROM users", "EXPLODE makes any number of rows"),
        # an expression over aggregates without GROUP BY is one row over the whole source, never a
        # projection of each barrier's rows (over a source that only grows, that appended a row a barrier)
        ("SELECT SUM(amount) / COUNT(*) AS mean FROM shopping", "is an expression over aggregates"),
        ("SELECT COALESCE(MAX(amount), 0) AS top FROM shopping", "is an expression over aggregates"),
        ("SELECT SUM(id) + 1 AS s FROM users", "is an expression over aggregates"),
        ("SELECT SUM(s.amount) / COUNT(*) AS mean FROM shopping s JOIN users u ON s.user_id = u.id",
         "is an expression over aggregates"),
    ],
)
def test_other_queries_fall_back_to_full_refresh_with_a_reason(query: str, reason: str) -> None:
    plan = plan_query(query, SHAPES)
    assert plan.kind == "full_refresh"
    assert reason in plan.reason
    assert plan.explain().startswith("full refresh: ") and reason in plan.explain()


@pytest.mark.parametrize(
    ("query", "key", "columns"),
    [
        ("SELECT o.oid, u.name, s.amount FROM orders o LEFT JOIN users u ON o.uid = u.id LEFT JOIN shopping s "
         "ON s.user_id = u.id", ("oid", NUMBER), ("oid",)),  # a user's purchases repeat an order: numbered
        ("SELECT s.user_id, u.name, o.oid FROM shopping s LEFT JOIN users u ON s.user_id = u.id LEFT JOIN orders o "
         "ON o.uid = u.id", ("user_id", NUMBER), ("user_id",)),  # no key: by the column it is joined on
        ("SELECT o.oid, u.region, COUNT(s.amount) AS n FROM orders o LEFT JOIN users u ON o.uid = u.id LEFT JOIN "
         "shopping s ON s.user_id = u.id GROUP BY o.oid, u.region HAVING COUNT(*) > 1", (0, 1), ("oid",)),
        ("SELECT u.region, o.uid, MAX(s.amount) - MIN(s.amount) AS spread FROM orders o LEFT JOIN users u "
         "ON o.uid = u.id LEFT JOIN shopping s ON s.user_id = u.id GROUP BY o.uid, u.region", (1, 0), ("uid",)),
    ],
)
def test_left_joins_of_more_tables_by_group_of_the_from_table(query: str, key: tuple, columns: tuple[str, ...]) -> None:
    plan = plan_query(query, SHAPES)
    assert (plan.kind, plan.key, plan.group_columns) == ("groups", key, columns)
    assert plan.explain().startswith("incremental groups: LEFT joins of")
    assert set(plan.reach) == set(plan.sources) - set(plan.group_sources)  # each other table finds its groups
    alias = query.split(" FROM ")[1].split()[1]  # the FROM table's: its groups
    assert all(q.startswith(f"SELECT {alias}.") and "WHERE" not in q and "HAVING" not in q for q in plan.reach.values())


def test_shapes_flow_down_the_pipeline() -> None:
    shapes = shapes_of(
        [("shopping", ()), ("users", ("id",))],
        [("per_user", "SELECT user_id, SUM(amount) t FROM shopping GROUP BY user_id"),
         ("big", "SELECT user_id, t FROM per_user WHERE t > 10"),
         ("names", "SELECT name FROM users")],
    )
    assert shapes["per_user"] == TableShape(("user_id",), False)
    assert shapes["big"] == TableShape(("user_id",), False)  # keyed by its source's key
    assert shapes["names"] == TableShape(None, False)  # full refresh: no key


@pytest.mark.parametrize(
    ("query", "key"),
    [
        ("SELECT 'o' AS origin, oid, total FROM orders UNION ALL SELECT 'u', id, 0 FROM users WHERE id > 1", (0, 1)),
        ("SELECT user_id, amount FROM shopping UNION ALL SELECT user_id, amount FROM shopping WHERE amount > 9", None),
        ("SELECT o.oid, u.name, 'x' AS tag FROM orders o JOIN users u ON o.uid = u.id "
         "UNION ALL SELECT oid, note, 'y' FROM orders", (2, 0)),
    ],
)
def test_union_all_of_projections_and_joins(query: str, key: tuple[int, ...] | None) -> None:
    plan = plan_query(query, SHAPES)
    assert (plan.kind, plan.key, plan.append_only) == ("union", key, key is None)
    assert len(plan.branches) == 2 and plan.explain().startswith("incremental union: UNION ALL of 2 branches")


def test_the_nexmark_pipeline_maintains_its_queries_incrementally_where_it_can() -> None:
    """pipelines/nexmark.sql: Nexmark's queries that Spark SQL expresses, and how each is kept."""
    pipeline = parse_pipeline((ROOT / "pipelines" / "nexmark.sql").read_text())
    plans = {t.name: plan_for(pipeline, t) for t in pipeline.derived}
    assert {n: str(p.kind) for n, p in plans.items()} == {
        "q0": "projection", "q1": "projection", "q2": "projection", "q3": "keyed_join", "q9": "keyed_aggregate",
        "q15": "aggregate", "q16": "aggregate", "q17": "keyed_aggregate", "q18": "groups", "q19": "keyed_aggregate",
        "q21": "projection", "q22": "projection", "q5": "groups", "q7": "groups", "q8": "groups", "q20": "keyed_join",
        "auction_bids": "keyed_join", "q4": "aggregate",  # q9 a keyed Top-N over a keyed join's table (in the
    }                                                     # changelog layout); q4 its winning bids' averages
    assert plans["q9"].sources == ("auction_bids",) and plans["q9"].top_n is not None and plans["q9"].changelog
    assert plans["q4"].changelog_sources == ("q9",) and "q9 in the changelog layout" in plans["q4"].explain()
    assert plans["q20"].join_columns == {"bid": ("auction",), "auction": ("id",)}  # WITH ('state' = 'keyed')
    assert plans["q5"].group_sources == {"bid": ("WINDOW(date_time, '10 seconds', '2 seconds')",)}  # by window
