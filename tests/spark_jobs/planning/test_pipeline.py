"""Pipeline files parse into tables and jobs, and bad ones say what to change."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.planning.pipeline import Column, PipelineError, load_pipeline, parse_pipeline
from tests.support import ROOT


def test_shopping_pipeline() -> None:
    pipeline = load_pipeline(ROOT / "pipelines" / "shopping.sql")
    (shopping,) = pipeline.roots
    assert shopping.topic == "shopping_source" and shopping.format == "json" and shopping.primary_key == ()
    assert shopping.columns[-1] == Column("price", "DOUBLE")
    assert [(j.job_id, j.sink, j.sources, j.external_topics) for j in pipeline.jobs] == [
        ("ingest_shopping", "shopping", (), ("shopping_source",)),
        ("maintain_user_item_amount", "user_item_amount", ("shopping",), ()),
        ("maintain_user_item_price", "user_item_price", ("shopping",), ()),
    ]
    assert "SUM(amount)" in pipeline.table("user_item_amount").query


def test_upsert_debezium_avro_insert_into_and_ctes(tmp_path: Path) -> None:
    (tmp_path / "s.avsc").write_text('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}')
    (tmp_path / "p.sql").write_text(
        """
        CREATE TABLE orders (id BIGINT, amount DOUBLE) WITH ('source'='kafka:orders_cdc', 'format'='debezium-json',
                                                            'primary_key'='id');
        CREATE TABLE raw (a BIGINT) WITH ('source'='kafka:raw', 'format'='avro', 'avro_schema_file'='s.avsc');
        CREATE TABLE IF NOT EXISTS big AS WITH o AS (SELECT * FROM orders) SELECT o.id, r.a FROM o JOIN raw r ON o.id = r.a;
        INSERT INTO audit SELECT id FROM orders WHERE amount > 100;
        """
    )
    pipeline = load_pipeline(tmp_path / "p.sql")
    orders, raw = pipeline.roots
    assert orders.primary_key == ("id",) and orders.format == "debezium-json" and orders.transactions is None
    assert raw.avro_schema is not None and '"long"' in raw.avro_schema
    big, audit = pipeline.derived
    assert big.sources == ("orders", "raw") and big.if_not_exists
    assert audit.sources == ("orders",) and not audit.declared_here


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("CREATE TABLE t (a BIGINT) WITH ('format'='json')", "needs 'source' = 'kafka:<topic>'"),
        ("CREATE TABLE t (a BIGINT) WITH ('source'='kafka:s', 'format'='csv')", "format 'csv' is not supported"),
        ("CREATE TABLE t (a BIGINT) WITH ('source'='kafka:s', 'colour'='red')", "unknown option(s) colour"),
        ("CREATE TABLE t (a BIGINT) WITH ('source'='kafka:s', 'primary_key'='b')", "primary key column(s) b"),
        ("CREATE TABLE t (a BIGINT) WITH ('source'='kafka:s', 'format'='debezium-json')", "needs a 'primary_key'"),
        ("CREATE TABLE t (a BIGINT) WITH ('source'='kafka:s', 'format'='avro')", "needs 'avro_schema'"),
        ("CREATE TABLE t (a BIGINT) WITH ('source'='kafka:p.public.t', 'transactions'='kafka:p.transaction')",
         "'transactions' needs a Debezium format"),
        ("CREATE TABLE t (a BIGINT) WITH ('source'='kafka:p.public.t', 'format'='debezium-json', 'primary_key'='a', "
         "'transactions'='p.transaction')", "'transactions' = 'kafka:<topic.prefix>.transaction'"),
        ("CREATE TABLE t (a BIGINT) WITH ('source'='kafka:t', 'format'='debezium-json', 'primary_key'='a', "
         "'transactions'='kafka:p.transaction')", "must be Debezium's <topic.prefix>.<schema>.<table>"),
        ("DROP TABLE t", "only CREATE TABLE"),
        ("CREATE TABLE t AS SELECT 1 AS a FROM s; CREATE TABLE t AS SELECT 2 AS a FROM s", "defined more than once: t"),
        ("SELEC 1 FROM", "SQL syntax error"),
        ("   ", "no statements"),
        ("CREATE TABLE t AS SELECT 1 AS a FROM s;\n\nINSERT OVERWRITE DIRECTORY '/x' SELECT * FROM t", "line 3 ("),
        ("INSERT OVERWRITE DIRECTORY '/x' SELECT * FROM t", "INSERT INTO writes a table of the pipeline"),
        ("CREATE TABLE t (a BIGINT) WITH ('source'='kafka:s', 'format'='avro', 'avro_schema_file'='nope.avsc')",
         "cannot read avro_schema_file nope.avsc: No such file or directory"),
        ("CREATE TABLE x__dlq AS SELECT 1 AS a FROM s", "reserved for Lockstep's own tables"),
        ("CREATE TABLE t AS SELECT k, SUM(v) FROM s GROUP BY k", "output column 2 (SUM(v)) has no name"),
        ("CREATE TABLE t AS SELECT 1 FROM s", "output column 1 (1) has no name"),
        ("CREATE TABLE t AS SELECT k AS `a-b` FROM s", "invalid column name 'a-b'"),
        ("CREATE TABLE t AS SELECT k AS __n FROM s", "Lockstep's bookkeeping columns"),
        ("INSERT OVERWRITE TABLE t SELECT k FROM s", "write INSERT INTO t SELECT"),
        ("CREATE TABLE `../x` (a BIGINT) WITH ('source'='kafka:s')", "invalid table name '../x'"),
        ("CREATE TABLE t (`a b` BIGINT) WITH ('source'='kafka:s')", "invalid column name 'a b'"),
        ("CREATE TABLE t (__lockstep_count BIGINT) WITH ('source'='kafka:s')", "Lockstep's bookkeeping columns"),
        ("INSERT INTO `t;x` SELECT 1 FROM s", "invalid table name 't;x'"),
        # idioms that would otherwise be misread: each says what to write instead
        ("CREATE TABLE v AS SELECT a FROM STREAM t", "write FROM t"),
        ("CREATE TABLE v AS SELECT a FROM STREAM(t)", "write FROM t"),
        ("CREATE TABLE v AS SELECT a FROM t VERSION AS OF 3", "reads a fixed version of t"),
        ("CREATE TABLE v AS SELECT a FROM t TIMESTAMP AS OF '2026-01-01'", "lockstep query --at-barrier"),
        ("CREATE TABLE v AS SELECT a FROM sales.t", "sales.t: Lockstep's tables live in the database default"),
        ("CREATE TABLE other.v AS SELECT a FROM t", "write v"),
        ("CREATE VIEW v AS SELECT a FROM t", "write CREATE MATERIALIZED VIEW v AS SELECT"),
        ("CREATE TEMPORARY TABLE v AS SELECT a FROM t", "a maintained table takes no options"),
        ("CREATE TABLE v USING parquet AS SELECT a FROM t", "USING PARQUET: a maintained table takes no options"),
        ("CREATE TABLE v WITH ('state' = 'rocksdb') AS SELECT a FROM t", "but WITH ('state' = 'keyed')"),
        ("CREATE TABLE v WITH ('state' = 'keyed', 'mode' = 'x') AS SELECT a FROM t", "takes no options"),
        ("CREATE TABLE v WITH ('state' = 'keyed', 'layout' = 'log') AS SELECT a FROM t", "'layout' = 'in-place' "),
        ("CREATE TABLE v WITH ('layout' = 'changelog') AS SELECT a FROM t", "add 'state' = 'keyed' or remove the layout"),
        ("CREATE TABLE t (a BIGINT NOT NULL) WITH ('source'='kafka:s')", "column a: NOT NULL is not enforced"),
        ("CREATE TABLE t (a BIGINT, b BIGINT, PRIMARY KEY (a) NOT ENFORCED) WITH ('source'='kafka:s', 'primary_key'='b')",
         "PRIMARY KEY (a) and 'primary_key' = 'b' differ"),
        ("CREATE TABLE t (a BIGINT, PRIMARY KEY (z) NOT ENFORCED) WITH ('source'='kafka:s')", "primary key column(s) z"),
    ],
)
def test_bad_pipelines_are_rejected_with_a_reason(sql: str, message: str) -> None:
    with pytest.raises(PipelineError) as info:
        parse_pipeline(sql)
    assert message in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="cannot read pipeline file"):
        load_pipeline(tmp_path / "nope.sql")


def test_a_debezium_table_with_transactions_cuts_the_transaction_topic_too() -> None:
    pipeline = parse_pipeline("CREATE TABLE debits (id BIGINT) WITH ('source' = 'kafka:bank.public.debits', "
                              "'format' = 'debezium-avro-confluent', 'primary_key' = 'id', "
                              "'transactions' = 'kafka:bank.transaction')")
    [debits] = pipeline.roots
    assert debits.transactions == "bank.transaction" and debits.collection == "public.debits"
    assert pipeline.jobs[0].external_topics == ("bank.public.debits", "bank.transaction")


def test_flink_and_databricks_idioms_mean_what_users_expect() -> None:
    """A materialized view is a maintained table; PRIMARY KEY ... NOT ENFORCED is the root's key
    (in the column list or on a column); CREATE OR REPLACE is CREATE (running a changed pipeline
    replaces the query anyway); default-qualified names are the plain ones, and the stored query
    reads the plain names (a job reads each barrier's version under them)."""
    pipeline = parse_pipeline("""
        CREATE OR REPLACE TABLE orders (id BIGINT, user_id BIGINT, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
          WITH ('source' = 'kafka:orders', 'format' = 'debezium-json');
        CREATE TABLE users (user_id BIGINT PRIMARY KEY NOT ENFORCED COMMENT 'who', name STRING)
          WITH ('source' = 'kafka:users');
        CREATE MATERIALIZED VIEW spend AS
          SELECT o.user_id, SUM(o.amount) AS total FROM default.orders AS o GROUP BY o.user_id;
        CREATE OR REPLACE MATERIALIZED VIEW named AS
          SELECT u.name, s.total FROM spark_catalog.default.users AS u JOIN spend AS s ON u.user_id = s.user_id;
    """)
    orders, users = pipeline.roots
    assert orders.primary_key == ("id",) and users.primary_key == ("user_id",)
    assert [c.name for c in users.columns] == ["user_id", "name"]
    spend, named = pipeline.derived
    assert (spend.name, spend.sources, named.sources) == ("spend", ("orders",), ("spend", "users"))
    assert "default" not in spend.query and "spark_catalog" not in named.query
    assert [j.job_id for j in pipeline.jobs] == ["ingest_orders", "ingest_users", "maintain_spend", "maintain_named"]
