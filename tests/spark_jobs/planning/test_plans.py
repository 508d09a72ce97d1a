"""Query analysis: which shape a query has, its key, and why a query falls back to full refresh."""

from __future__ import annotations

import pytest

from spark_jobs.planning.plans import HIDDEN, TableShape, plan_query, shapes_of

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
        ("SELECT name, id FROM users WHERE id > 3", "projection", (1,)),
        ("SELECT * FROM users", "projection", ("id",)),
        ("SELECT o.oid, u.id, u.name FROM orders o LEFT JOIN users u ON o.uid = u.id", "join", (0, 1)),
        ("SELECT o.oid, u.id FROM orders AS o INNER JOIN users AS u ON o.uid = u.id AND u.id > 0", "join", (0, 1)),
        ("SELECT u.name, SUM(o.total) s, MAX(o.total) m FROM orders o JOIN users u ON o.uid = u.id GROUP BY u.name",
         "join_aggregate", (0,)),
    ],
)
def test_incremental_shapes(query: str, kind: str, key: tuple | None) -> None:
    plan = plan_query(query, SHAPES)
    assert (plan.kind, plan.key) == (kind, key)
    assert plan.explain().startswith(f"incremental {kind.replace('_', ' + ')}")
    assert HIDDEN + "w" in plan.change_query or "*" in plan.change_query  # SELECT * carries the weight


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("SELECT name FROM users", "key (id) is not selected"),
        ("SELECT uid, SUM(t) / COUNT(*) AS m FROM orders GROUP BY uid", "an expression over aggregates"),
        ("SELECT COUNT(*) FROM users", "without GROUP BY"),
        ("SELECT id, SUM(x) FROM users GROUP BY id HAVING SUM(x) > 1", "HAVING"),
        ("SELECT id FROM users ORDER BY id", "ORDER BY / LIMIT"),
        ("SELECT id FROM users UNION SELECT oid FROM orders", "UNION"),
        ("SELECT a.id FROM users a JOIN users b ON a.id = b.id", "self-joins"),
        ("SELECT o.oid FROM orders o JOIN users u ON uid = id", "qualify both columns"),
        ("SELECT o.oid, u.id FROM orders o RIGHT JOIN users u ON o.uid = u.id", "RIGHT JOIN"),
        ("SELECT o.oid, u.id FROM orders o JOIN users u ON o.uid > u.id", "no equality"),
        ("SELECT id, rank() OVER (ORDER BY id) FROM users", "window"),
        ("SELECT id FROM users WHERE id IN (SELECT uid FROM orders)", "subqueries"),
        ("SELECT region, SUM(id) FROM users GROUP BY region, name", "not in the select list"),
        ("SELECT o.oid, u.name FROM orders o JOIN users u ON o.uid = u.id", "has no key"),
    ],
)
def test_other_queries_fall_back_to_full_refresh_with_a_reason(query: str, reason: str) -> None:
    plan = plan_query(query, SHAPES)
    assert plan.kind == "full_refresh"
    assert reason in plan.reason
    assert plan.explain().startswith("full refresh: ") and reason in plan.explain()


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
