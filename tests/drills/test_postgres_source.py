"""The shop demo, real: PostgreSQL tables (pipelines/shop/postgres.sql) captured by Debezium
(pipelines/shop/connector.json) into pipelines/shop.sql while transactions change orders,
prices and customers' regions; once the source is quiet, every maintained table equals the
same query run in PostgreSQL itself."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from decimal import Decimal

import pytest
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from tests.support import ROOT, wait_until
from tests.support.barriers import at, wait_for_barrier
from tests.support.cdc import CdcStack, end_offset, settled

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TABLES = ("customers", "products", "orders")
# each derived table's query, as PostgreSQL runs it (the pipeline's, with the same column order)
IN_POSTGRES = {
    "product_revenue": "SELECT o.product_id, p.name, SUM(o.quantity * p.price), COUNT(*) FROM orders o "
                       "JOIN products p ON o.product_id = p.id GROUP BY o.product_id, p.name",
    "region_orders": "SELECT c.region, o.status, COUNT(*), SUM(o.quantity) FROM orders o "
                     "JOIN customers c ON o.customer_id = c.id GROUP BY c.region, o.status",
}


def workload(rng: random.Random, transactions: int) -> str:
    """Transactions a shop makes: new orders, status changes, cancellations, price changes,
    customers moving region; several tables in one transaction."""
    statements, next_id = [], 1000
    for _ in range(transactions):
        body = []
        for _ in range(rng.randint(1, 4)):
            kind = rng.random()
            if kind < 0.45:
                next_id += 1
                body.append(f"INSERT INTO orders (id, customer_id, product_id, quantity) VALUES "
                            f"({next_id}, {rng.randint(1, 20)}, {rng.randint(1, 10)}, {rng.randint(1, 5)})")
            elif kind < 0.65:
                body.append(f"UPDATE orders SET status = '{rng.choice(['paid', 'shipped'])}', quantity = quantity + 1 "
                            f"WHERE id = {rng.randint(1, 100)}")
            elif kind < 0.75:
                body.append(f"DELETE FROM orders WHERE id = {rng.randint(1, 100)}")
            elif kind < 0.9:
                body.append(f"UPDATE products SET price = price + 0.25 WHERE id = {rng.randint(1, 10)}")
            else:
                body.append(f"UPDATE customers SET region = '{rng.choice(['north', 'south', 'east', 'west'])}' "
                            f"WHERE id = {rng.randint(1, 20)}")
        statements.append("BEGIN; " + "; ".join(body) + "; COMMIT;")
    return "\n".join(statements)


def postgres_rows(stack: CdcStack, query: str) -> set[tuple[str, ...]]:
    out = stack.postgres.sql(query)
    return {tuple(line.split("|")) for line in out.splitlines() if line}


def as_text(value: object) -> str:
    return str(value) if not isinstance(value, Decimal) else format(value, "f")


def test_the_shop_demo_keeps_postgres_tables_and_their_joins_equal_to_postgres(
    spark: SparkSession, run_pipeline: Callable[..., Settings], cdc_stack: CdcStack, kafka_bootstrap: str
) -> None:
    pg = cdc_stack.postgres
    pg.sql((ROOT / "pipelines/shop/postgres.sql").read_text())
    connector = json.loads((ROOT / "pipelines/shop/connector.json").read_text())
    connector["config"] |= {"database.port": str(pg.port), "database.dbname": pg.database}
    cdc_stack.connect.add(connector)
    topics = {t: f"shop.public.{t}" for t in TABLES}
    snapshot = {"customers": 20, "products": 10, "orders": 100}  # the rows postgres.sql inserts
    wait_until(lambda: all(end_offset(kafka_bootstrap, topics[t]) >= n for t, n in snapshot.items()),
               "the snapshot of the three tables", timeout=90)
    settings = run_pipeline((ROOT / "pipelines/shop.sql").read_text(), schema_registry_url=cdc_stack.registry.url)

    pg.sql(workload(random.Random(30), transactions=150))
    offsets = settled(kafka_bootstrap, list(topics.values()))  # the source is quiet: Debezium wrote every change
    ends = {table: offsets[topic] for table, topic in topics.items()}
    state, b = wait_for_barrier(settings, [*TABLES, *IN_POSTGRES], {0: ends["orders"]}, topics["orders"], timeout=180)
    for table, topic in topics.items():
        cut = {c.partition: c.offset for c in state.barriers[b].cut if c.topic == topic}
        assert cut == {0: ends[table]}, f"barrier {b} does not cover all of {topic}"
    for table in TABLES:
        frame = at(spark, settings, table, state.exact_points(table)[b])
        columns = [f.name for f in frame.schema.fields]
        # the session's time zone is UTC: both sides print the instant in UTC, to the microsecond
        mine = {tuple(as_text(v) for v in r) for r in frame.selectExpr(*[
            "date_format(placed_at, 'yyyy-MM-dd HH:mm:ss.SSSSSS')" if c == "placed_at" else c for c in columns]).collect()}
        expected = postgres_rows(cdc_stack, f"SELECT {', '.join(columns)} FROM {table}".replace(
            "placed_at", "to_char(placed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"))
        assert mine == expected, f"{table} differs from PostgreSQL"
    for table, query in IN_POSTGRES.items():
        frame = at(spark, settings, table, state.exact_points(table)[b])
        visible = [f.name for f in frame.schema.fields if not f.name.startswith("__lockstep")]
        mine = {tuple(as_text(v) for v in r) for r in frame.select(*visible).collect()}
        assert mine == postgres_rows(cdc_stack, query), f"{table} differs from the same query in PostgreSQL"
