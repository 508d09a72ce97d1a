"""Run one read-only query over Delta table versions with DataFusion (delta-rs's
``QueryBuilder``), in PostgreSQL's dialect, and return Arrow.

Each table of the query is registered under a name of its own and shown to the query as a view
of its visible columns under the table's name, so the bookkeeping columns (``__lockstep_*``)
never show and the query's text runs as the client wrote it; a changelog table's view keeps each
key's newest row. Lineage tables are views over their rows.

Example::

    table = run_query("SELECT page, views FROM views_per_page", {"views_per_page": delta_table})
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError

from coordinator.domain.lineage import LineageTable
from coordinator.domain.snapshot import HIDDEN, is_changelog, latest_rows_sql
from lockstep_reads.statements import StatementError
from lockstep_reads.tables import VersionGone, first_line, gone

# PostgreSQL's rule for names (unquoted ones fold to lower case); a small machine's two cores
SESSION = {"datafusion.sql_parser.enable_ident_normalization": "true", "datafusion.execution.target_partitions": "2"}


class QueryError(StatementError):
    """The engine could not run the query (unknown column, type error, ...): its first line."""


def quoted(name: str) -> str:
    """A SQL identifier in double quotes.

    >>> quoted('we"ird')
    '"we""ird"'
    """
    return '"' + name.replace('"', '""') + '"'


def visible_columns(table: DeltaTable) -> list[str]:
    return [f.name for f in table.schema().fields if not f.name.startswith(HIDDEN)]


def run_query(sql: str, tables: Mapping[str, DeltaTable], lineage: Mapping[str, LineageTable] | None = None,
              limit: int | None = None) -> pa.Table:
    """``sql`` over ``tables`` (name -> an opened version) and ``lineage`` views, at most
    ``limit`` rows (the rest is not computed where the plan streams); ``QueryError`` with the
    engine's message if it cannot run."""
    builder = QueryBuilder(SESSION)
    try:
        for i, (name, table) in enumerate(sorted(tables.items())):
            hidden = f"{HIDDEN}t{i}"  # registered names fold to lower case; the view keeps the table's own
            builder.register(hidden, table)
            columns = list(map(quoted, visible_columns(table)))
            rows = latest_rows_sql(quoted(hidden), columns) if is_changelog([f.name for f in table.schema().fields]) \
                else f"SELECT {', '.join(columns)} FROM {quoted(hidden)}"
            _run(builder, f"CREATE VIEW {quoted(name)} AS {rows}")
        for name, rows in (lineage or {}).items():
            _run(builder, f"CREATE VIEW {quoted(name)} AS {values_query(rows)}")
        return _run(builder, sql, limit)
    except (DeltaError, pa.ArrowException) as exc:  # the rows stream: a missing file shows as Arrow's error
        if gone(exc):
            raise VersionGone(f"a file of a version read is gone (vacuumed): {first_line(exc)}") from exc
        raise QueryError(" ".join(line.strip() for line in str(exc).splitlines() if line.strip())) from exc


def _run(builder: QueryBuilder, sql: str, limit: int | None = None) -> pa.Table:
    reader = pa.RecordBatchReader.from_stream(builder.execute(sql))
    if limit is None:
        return plain_strings(reader.read_all())
    batches, rows = [], 0
    for batch in reader:
        batches.append(batch.slice(0, limit - rows))
        rows += batches[-1].num_rows
        if rows >= limit:
            break
    return plain_strings(pa.Table.from_batches(batches, reader.schema))


def plain_strings(table: pa.Table) -> pa.Table:
    """``table`` with DataFusion's string and binary views as plain strings and binaries: what
    pandas, polars, Arrow readers and the wire protocol expect.

    >>> plain_strings(pa.table({"s": pa.array(["a"], pa.string_view())})).schema.field("s").type
    DataType(string)
    """
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    if not any(f.type in plain for f in table.schema):
        return table
    return table.cast(pa.schema([f.with_type(plain.get(f.type, f.type)) for f in table.schema]))


def values_query(table: LineageTable) -> str:
    """A query that returns ``table``'s rows with its column names and types (type ``NULL``: a
    column of nothing but NULLs, whatever it is compared with).

    >>> print(values_query(LineageTable((("a", "STRING"), ("n", "BIGINT")), [("x", 1)])))
    SELECT CAST(column1 AS VARCHAR) AS "a", CAST(column2 AS BIGINT) AS "n" FROM (VALUES ('x', 1))
    >>> values_query(LineageTable((("a", "STRING"), ("b", "NULL")), []))
    'SELECT CAST(NULL AS VARCHAR) AS "a", NULL AS "b" WHERE false'
    """
    types = [("VARCHAR" if kind == "STRING" else kind) for _, kind in table.columns]

    def column(value: str, name: str, kind: str) -> str:
        return f"NULL AS {quoted(name)}" if kind == "NULL" else f"CAST({value} AS {kind}) AS {quoted(name)}"

    if not table.rows:
        return "SELECT " + ", ".join(column("NULL", c, k) for (c, _), k in zip(table.columns, types, strict=True)) \
            + " WHERE false"
    rows = ", ".join("(" + ", ".join(literal(v, t) for v, t in zip(row, types, strict=True)) + ")" for row in table.rows)
    return ("SELECT " + ", ".join(column(f"column{i + 1}", c, k)
                                  for i, ((c, _), k) in enumerate(zip(table.columns, types, strict=True)))
            + f" FROM (VALUES {rows})")


def literal(value: object, kind: str) -> str:
    """A SQL literal of ``value`` (a TIMESTAMP column holds epoch milliseconds).

    >>> literal("it's", "VARCHAR"), literal(None, "BIGINT"), literal(0, "TIMESTAMP")
    ("'it''s'", 'NULL', "'1970-01-01 00:00:00.000'")
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if kind == "TIMESTAMP" and isinstance(value, int):
        return "'" + dt.datetime.fromtimestamp(value / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "'"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)
