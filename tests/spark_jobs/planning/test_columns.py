"""Column-level lineage from a pipeline's SQL."""

from __future__ import annotations

from spark_jobs.planning.columns import column_lineage
from spark_jobs.planning.pipeline import parse_pipeline


def test_each_column_names_the_source_columns_it_is_computed_from() -> None:
    pipeline = parse_pipeline("""
        CREATE TABLE orders (id BIGINT, user_id BIGINT, amount BIGINT, price DOUBLE) WITH ('source' = 'kafka:o');
        CREATE TABLE users (user_id BIGINT, name STRING) WITH ('source' = 'kafka:u');
        CREATE TABLE spend AS SELECT user_id, SUM(amount * price) AS total, COUNT(*) AS n FROM orders GROUP BY user_id;
        CREATE TABLE named AS SELECT u.name, s.total, 1 AS one FROM users AS u JOIN spend AS s ON u.user_id = s.user_id;
        CREATE TABLE big AS SELECT * FROM orders WHERE amount > 10;
        INSERT INTO elsewhere SELECT x FROM not_declared;
    """)
    columns = column_lineage(pipeline)
    assert columns["spend"] == {"user_id": ["orders.user_id"], "total": ["orders.amount", "orders.price"], "n": []}
    assert columns["named"] == {"name": ["users.name"], "total": ["spend.total"], "one": []}  # one hop: spend, not orders
    assert columns["big"] == {c: [f"orders.{c}"] for c in ("id", "user_id", "amount", "price")}  # * expanded
    assert columns["elsewhere"] is None  # its source's columns are not in this file
