"""The derived tables the incremental-maintenance tests run, and each one computed in plain Python.

Sources: ``orders`` {oid: (oid, uid, amount, price, note)} and ``users`` {id: (id, name, region)}.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

ORDERS = "oid BIGINT, uid BIGINT, amount BIGINT, price DOUBLE, note STRING"
USERS = "id BIGINT, name STRING, region STRING"

Row = tuple[Any, ...]


def left_join(orders: dict[int, Row], users: dict[int, Row]) -> list[tuple[Row, Row | None]]:
    """users LEFT JOIN orders ON users.id = orders.uid, as (user, order or None)."""
    out: list[tuple[Row, Row | None]] = []
    for u in users.values():
        matches = [o for o in orders.values() if o[1] is not None and o[1] == u[0]]
        out += [(u, o) for o in matches] or [(u, None)]
    return out


def by_user(orders: dict[int, Row]) -> dict[Any, list[Row]]:
    groups: dict[Any, list[Row]] = defaultdict(list)
    for o in orders.values():
        groups[o[1]].append(o)
    return groups


def aggregates(orders: dict[int, Row], users: dict[int, Row]) -> list[Row]:
    out = []
    for uid, rows in by_user(orders).items():
        prices = [r[3] for r in rows if r[3] is not None]
        notes = [r[4] for r in rows if r[4] is not None]
        out.append((uid, sum(r[2] for r in rows), len(rows), len(notes),
                    sum(prices) / len(prices) if prices else None,
                    min(r[2] for r in rows), max(r[2] for r in rows), len(set(notes))))
    return out


def region_totals(orders: dict[int, Row], users: dict[int, Row]) -> list[Row]:
    groups: dict[Any, list[Row | None]] = defaultdict(list)
    for u, o in left_join(orders, users):
        groups[u[2]].append(o)
    return [(region, len(os), sum(o[2] for o in os if o) if any(os) else None) for region, os in groups.items()]


# query -> the same query in plain Python over {oid: row} and {id: row}
QUERIES: dict[str, tuple[str, Callable[[dict[int, Row], dict[int, Row]], list[Row]]]] = {
    "big_orders": (
        "SELECT oid, uid, amount * 2 AS double_amount FROM orders WHERE amount > 3",
        lambda o, u: [(r[0], r[1], r[2] * 2) for r in o.values() if r[2] > 3],
    ),
    "per_user": (
        "SELECT uid, SUM(amount) AS total, COUNT(*) AS n, COUNT(note) AS notes, AVG(price) AS avg_price, "
        "MIN(amount) AS lo, MAX(amount) AS hi, COUNT(DISTINCT note) AS kinds FROM orders GROUP BY uid",
        aggregates,
    ),
    "named_orders": (
        "SELECT o.oid, u.id, u.name, o.amount FROM orders o JOIN users u ON o.uid = u.id",
        lambda o, u: [(r[0], u[r[1]][0], u[r[1]][1], r[2]) for r in o.values() if r[1] in u],
    ),
    "per_region": (
        "SELECT u.region, COUNT(*) AS n, SUM(o.amount) AS total FROM users u LEFT JOIN orders o ON u.id = o.uid "
        "GROUP BY u.region",
        region_totals,
    ),
    "mean_amount": (  # an expression over aggregates: its changed groups recomputed
        "SELECT uid, SUM(amount) / COUNT(*) AS mean FROM orders GROUP BY uid",
        lambda o, u: [(uid, sum(r[2] for r in rows) / len(rows)) for uid, rows in by_user(o).items()],
    ),
}
# over the whole table (tests/spark_jobs/runtime/test_ivm.py only: the CDC drill keeps to QUERIES)
EVERYTHING: dict[str, tuple[str, Callable[[dict[int, Row], dict[int, Row]], list[Row]]]] = {
    "everything": (  # one row, without GROUP BY: kept by the changes
        "SELECT COUNT(*) AS n, SUM(amount) AS total FROM orders",
        lambda o, u: [(len(o), sum(r[2] for r in o.values()) if o else None)],
    ),
    "overall_mean": (  # an expression over aggregates without GROUP BY: recomputed at every barrier
        "SELECT SUM(amount) / COUNT(*) AS mean FROM orders",
        lambda o, u: [(sum(r[2] for r in o.values()) / len(o) if o else None,)],
    ),
}


def normalise(rows: list[Row]) -> list[Row]:
    """Rows in a stable order, floats rounded (incremental sums add in another order)."""
    return sorted((tuple(round(v, 6) if isinstance(v, float) else v for v in r) for r in rows), key=repr)


def derived_sql(queries: dict[str, tuple[str, Callable[..., list[Row]]]] = QUERIES) -> str:
    return "\n".join(f"CREATE TABLE {name} AS {query};" for name, (query, _) in queries.items())
