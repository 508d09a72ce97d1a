"""What a SQL text asks for, decided before anything runs (pure: sqlglot only)."""

from __future__ import annotations

import pytest

from lockstep_reads.statements import Kind, Refused, StatementError, lineage_named, split, tables_named


@pytest.mark.parametrize(("sql", "kinds"), [
    ("SELECT 1", ["query"]),
    ("  select 1 ; ", ["query"]),
    ("WITH x AS (SELECT 1) SELECT * FROM x", ["query"]),
    ("VALUES (1), (2)", ["query"]),
    ("SELECT 1 UNION ALL SELECT 2", ["query"]),
    ("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1; COMMIT", ["begin", "query", "commit"]),
    ("START TRANSACTION; ROLLBACK", ["begin", "rollback"]),
    ("SET lockstep.as_of_barrier = 5", ["set"]),
    ("RESET lockstep.as_of_barrier", ["reset"]),
    ("SHOW lockstep.barrier", ["show"]),
    ("SELECT ';' AS semicolon; SELECT 2", ["query", "query"]),  # a semicolon in a string splits nothing
    ("", ["empty"]),
    ("INSERT INTO t VALUES (1)", ["other"]),
    ("DISCARD ALL", ["other"]),
])
def test_statements_are_split_and_classified(sql: str, kinds: list[str]) -> None:
    assert [str(s.kind) for s in split(sql)] == kinds


@pytest.mark.parametrize("sql", [
    "INSERT INTO orders VALUES (1)", "UPDATE orders SET n = 1", "DELETE FROM orders",
    "MERGE INTO a USING b ON a.k = b.k WHEN MATCHED THEN DELETE",
    "CREATE TABLE x (a INT)", "CREATE VIEW v AS SELECT 1", "DROP TABLE orders", "ALTER TABLE orders ADD COLUMN c INT",
    "COPY (SELECT 1) TO '/tmp/out.csv'", "CREATE EXTERNAL TABLE e STORED AS CSV LOCATION '/etc/passwd'", "DISCARD ALL",
])
def test_writes_ddl_and_copies_are_refused_with_what_they_are(sql: str) -> None:
    statement = split(sql)[0]
    with pytest.raises(Refused, match=f"^{statement.verb} is not allowed: .* read-only"):
        statement.require_query()


def test_sql_that_does_not_parse_says_where() -> None:
    with pytest.raises(StatementError, match="does not parse"):
        split("SELECT FROM WHERE (")


def test_tables_are_named_as_postgres_folds_them_without_ctes_catalogs_or_lineage() -> None:
    tree = split('WITH recent AS (SELECT * FROM Orders) SELECT * FROM recent JOIN public."Users" u ON true '
                 "JOIN pg_catalog.pg_class c ON true JOIN information_schema.tables i ON true "
                 "JOIN __META_ETL_SINK s ON true, generate_series(1, 3)")[0].tree
    assert tree is not None
    assert tables_named(tree) == ["Users", "orders"]
    assert lineage_named(tree)
    assert not lineage_named(split("SELECT * FROM orders")[0].tree)  # type: ignore[arg-type]


def test_a_schema_other_than_public_is_an_error_that_names_it() -> None:
    with pytest.raises(StatementError, match="schema 'sales' does not exist: .* 'public'"):
        tables_named(split("SELECT * FROM sales.orders")[0].tree)  # type: ignore[arg-type]


@pytest.mark.parametrize("sql", [
    "SELECT * FROM orders, __lockstep_t0 WHERE EXISTS (WITH __lockstep_t0 AS (SELECT 1) SELECT 1)",
    "WITH __LOCKSTEP_T0 AS (SELECT 1) SELECT * FROM __lockstep_t0",
    'SELECT "__lockstep_key" FROM orders',
    "SELECT * FROM public.__lockstep_t1",
])
def test_lockstep_s_own_names_are_refused_in_every_scope(sql: str) -> None:
    with pytest.raises(StatementError, match="names starting with __lockstep_ are Lockstep's own"):
        tables_named(split(sql)[0].tree)  # type: ignore[arg-type]


def test_a_statement_knows_its_verb() -> None:
    assert split("  insert into t values (1)")[0].verb == "INSERT"
    assert split("")[0].kind == Kind.EMPTY
