"""The engine a read runs in: only the tables a read was given, and the lineage rows as views."""

from __future__ import annotations

import datetime as dt

import pytest

from coordinator.domain.lineage import LineageTable
from lockstep_reads.engine import run_query
from lockstep_reads.statements import QueryError


@pytest.mark.parametrize("sql", ["SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM read_parquet('/tmp/t.parquet')",
                                 "SELECT * FROM '/etc/passwd'", "SELECT * FROM \"/etc/passwd\""])
def test_a_query_reads_no_file_by_its_path(sql: str) -> None:
    with pytest.raises(QueryError, match="not found"):
        run_query(sql, {})


def test_rows_given_as_a_view_read_with_their_types_and_a_limit() -> None:
    rows = LineageTable((("table_name", "STRING"), ("barrier", "BIGINT"), ("committed_at", "TIMESTAMP")),
                        [("a", 3, 0), ("it's", None, 86_400_000)])
    table = run_query("SELECT * FROM v ORDER BY table_name", {}, {"v": rows})
    assert table.to_pylist() == [{"table_name": "a", "barrier": 3, "committed_at": dt.datetime(1970, 1, 1)},
                                 {"table_name": "it's", "barrier": None, "committed_at": dt.datetime(1970, 1, 2)}]
    assert run_query("SELECT * FROM v", {}, {"v": rows}, limit=1).num_rows == 1
    assert run_query("SELECT * FROM v", {}, {"v": LineageTable(rows.columns, [])}).num_rows == 0
