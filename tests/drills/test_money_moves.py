"""Consistent from the source's commit: every PostgreSQL transaction moves money (rows into
``debits`` and ``credits``, same amounts, one transaction), Debezium writes the two tables to two
topics, and at every barrier both tables and their aggregates, kept with ``'transactions'``,
hold the same total. The same topics ingested without the option are the negative control:
their totals must differ at some barrier, or this probe proves nothing."""

from __future__ import annotations

import random
from collections.abc import Callable
from decimal import Decimal

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from coordinator.domain import MetaState
from coordinator.settings import Settings
from tests.support import wait_until
from tests.support.barriers import wait_for_barrier
from tests.support.cdc import CdcStack, end_offset, settled

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.barrier_interval_ms(500)]

POSTGRES = """
DROP TABLE IF EXISTS debits; DROP TABLE IF EXISTS credits;
CREATE TABLE debits (id bigint PRIMARY KEY, account int NOT NULL, amount numeric(12, 2) NOT NULL);
CREATE TABLE credits (id bigint PRIMARY KEY, account int NOT NULL, amount numeric(12, 2) NOT NULL);
INSERT INTO debits VALUES (0, 0, 100.00); INSERT INTO credits VALUES (0, 0, 100.00);
"""  # the opening balance: the snapshot (outside any transaction) creates both topics
ROOT = ("CREATE TABLE {name} (id BIGINT, account INT, amount DECIMAL(12, 2)) WITH ('source' = 'kafka:{prefix}.public.{side}', "
        "'format' = 'debezium-avro-confluent', 'primary_key' = 'id'{aligned});")
AGGREGATE = "CREATE TABLE {name} AS SELECT account, SUM(amount) AS total FROM {source} GROUP BY account;"
PAIRS = {"aligned": ("debits", "credits"), "aggregates": ("debited", "credited"), "control": ("debits_raw", "credits_raw")}
ROUNDS, MAX_ROUNDS = 1, 5  # rounds of transfers; more (up to the most) until the control has shown a split


def pipeline(prefix: str) -> str:
    aligned = f", 'transactions' = 'kafka:{prefix}.transaction'"
    return "\n".join([
        ROOT.format(name="debits", prefix=prefix, side="debits", aligned=aligned),
        ROOT.format(name="credits", prefix=prefix, side="credits", aligned=aligned),
        AGGREGATE.format(name="debited", source="debits"),
        AGGREGATE.format(name="credited", source="credits"),
        ROOT.format(name="debits_raw", prefix=prefix, side="debits", aligned=""),
        ROOT.format(name="credits_raw", prefix=prefix, side="credits", aligned=""),
    ])


def transfers(rng: random.Random, first_id: int, count: int) -> tuple[str, int]:
    """``count`` transactions, each moving money: 1-4 transfers written debits first, then credits
    (so a cut between the two topics splits them), or a correction or reversal of earlier ones."""
    statements, next_id = ["SET synchronous_commit = off;"], first_id
    for _ in range(count):
        kind = rng.random()
        if kind < 0.8 or next_id == first_id:
            moves = [(next_id + i, rng.randint(1, 9), rng.randint(1, 9), Decimal(rng.randint(1, 100_000)) / 100)
                     for i in range(rng.randint(1, 4))]
            next_id += len(moves)
            body = [f"INSERT INTO debits VALUES ({i}, {src}, {amount})" for i, src, _, amount in moves]
            body += [f"INSERT INTO credits VALUES ({i}, {dst}, {amount})" for i, _, dst, amount in moves]
        else:
            row = rng.randint(first_id, next_id - 1)
            if kind < 0.9:
                body = [f"UPDATE {t} SET amount = amount + 1 WHERE id = {row}" for t in ("debits", "credits")]
            else:
                body = [f"DELETE FROM {t} WHERE id = {row}" for t in ("debits", "credits")]
        statements.append("BEGIN; " + "; ".join(body) + "; COMMIT;")
        if len(statements) % 20 == 0:
            statements.append("SELECT pg_sleep(0.05);")  # a few seconds of transactions: many barriers cut them
    return "\n".join(statements), next_id


def totals_by_version(spark: SparkSession, settings: Settings, table: str, column: str) -> dict[int, Decimal]:
    """The table's total of ``column`` at each of its Delta versions, from one read of its change feed."""
    sign = F.when(F.col("_change_type").isin("insert", "update_postimage"), 1).otherwise(-1)
    changes = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
               .load(settings.table_location(table))
               .groupBy("_commit_version").agg(F.sum(F.col(column) * sign).alias("delta")).collect())
    running, out = Decimal(0), {}
    for row in sorted(changes, key=lambda r: r["_commit_version"]):
        running += row["delta"] or 0
        out[row["_commit_version"]] = running
    return out


def split_barriers(spark: SparkSession, settings: Settings, state: MetaState, pair: tuple[str, str],
                   column: str) -> tuple[int, list[str]]:
    """(barriers both tables hold, the ones where their totals differ)."""
    left, right = (state.exact_points(t) for t in pair)
    totals = [totals_by_version(spark, settings, t, column) for t in pair]

    def total(which: int, version: int) -> Decimal:
        earlier = [v for v in totals[which] if v <= version]  # a version without changes holds the total before it
        return totals[which][max(earlier)] if earlier else Decimal(0)

    common = sorted(set(left) & set(right))
    splits = [f"barrier {b}: {total(0, left[b])} vs {total(1, right[b])}"
              for b in common if total(0, left[b]) != total(1, right[b])]
    return len(common), splits


def test_every_barrier_holds_whole_source_transactions_and_the_control_without_alignment_does_not(
    spark: SparkSession, run_pipeline: Callable[..., Settings], cdc_stack: CdcStack, kafka_bootstrap: str
) -> None:
    pg = cdc_stack.postgres
    pg.sql(POSTGRES)
    prefix = cdc_stack.capture(["public.debits", "public.credits"])
    topics = [f"{prefix}.public.debits", f"{prefix}.public.credits", f"{prefix}.transaction"]
    rng = random.Random(276)
    script, next_id = transfers(rng, 1, 1)
    pg.sql(script)  # a first transfer: the transaction topic exists before the pipeline starts
    wait_until(lambda: all(end_offset(kafka_bootstrap, t) >= 2 for t in topics), "the snapshot and a transfer", 60)
    settings = run_pipeline(pipeline(prefix), schema_registry_url=cdc_stack.registry.url)
    rounds, tables = 0, [t for pair in PAIRS.values() for t in pair]
    control: list[str] = []
    while rounds < ROUNDS or (not control and rounds < MAX_ROUNDS):
        rounds += 1
        script, next_id = transfers(rng, next_id, 400)
        pg.sql(script)  # the pipeline's jobs run while the transactions commit
        ends = settled(kafka_bootstrap, topics, quiet_s=2.0)
        for topic in topics:  # a barrier after every END, and after every change of both topics
            state, b = wait_for_barrier(settings, tables, {0: ends[topic]}, topic, timeout=240)
        control = split_barriers(spark, settings, state, PAIRS["control"], "amount")[1]

    for name, pair in PAIRS.items():
        if name == "control":
            continue
        held, splits = split_barriers(spark, settings, state, pair, "total" if name == "aggregates" else "amount")
        assert held >= 5, f"{pair}: only {held} barriers to check"
        assert splits == [], f"{pair} split a source transaction: {splits[:5]}"
    assert control, (f"the control (the same topics without 'transactions') never split a transaction in "
                     f"{rounds} rounds: this probe would not notice a split")
    print(f"{rounds} rounds, {next_id - 1} transfers; the control split transactions at {len(control)} barriers, "
          f"e.g. {control[:3]}")
