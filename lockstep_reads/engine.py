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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError

from coordinator.domain.lineage import LineageTable
from coordinator.domain.snapshot import HIDDEN, is_changelog, latest_rows_sql
from lockstep_reads.statements import QueryError
from lockstep_reads.tables import VersionGone, first_line, gone

# PostgreSQL's rule for names (unquoted ones fold to lower case); a small machine's two cores
SESSION = {"datafusion.sql_parser.enable_ident_normalization": "true", "datafusion.execution.target_partitions": "2"}


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
    schema, batches = stream_query(sql, tables, lineage)
    taken, rows = [], 0
    for batch in batches:
        if limit is not None and rows + batch.num_rows >= limit:
            taken.append(batch.slice(0, limit - rows))
            break
        taken.append(batch)
        rows += batch.num_rows
    return pa.Table.from_batches(taken, schema)


def stream_query(sql: str, tables: Mapping[str, DeltaTable],
                 lineage: Mapping[str, LineageTable] | None = None) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """``sql``'s rows as they come (a batch at a time, each computed when asked for): its schema
    and the batches, strings plain (``plain_schema``). Raises ``QueryError`` or ``VersionGone``,
    when planning or from the iterator."""
    builder = QueryBuilder(SESSION)
    with _errors():
        for i, (name, table) in enumerate(sorted(tables.items())):
            hidden = f"{HIDDEN}t{i}"  # registered names fold to lower case; the view keeps the table's own
            builder.register(hidden, table)
            columns = list(map(quoted, visible_columns(table)))
            rows = latest_rows_sql(quoted(hidden), columns) if is_changelog([f.name for f in table.schema().fields]) \
                else f"SELECT {', '.join(columns)} FROM {quoted(hidden)}"
            _execute(builder, f"CREATE VIEW {quoted(name)} AS {rows}").read_all()
        for name, rows in (lineage or {}).items():
            _execute(builder, f"CREATE VIEW {quoted(name)} AS {values_query(rows)}").read_all()
        reader = _execute(builder, sql)
    schema = plain_schema(reader.schema)

    def batches() -> Iterator[pa.RecordBatch]:
        with _errors():  # the rows stream: a missing file shows as Arrow's error while they do
            for batch in reader:
                yield batch if batch.schema == schema else batch.cast(schema)

    return schema, batches()


def _execute(builder: QueryBuilder, sql: str) -> pa.RecordBatchReader:
    return pa.RecordBatchReader.from_stream(builder.execute(sql))


@contextmanager
def _errors() -> Iterator[None]:
    """delta-rs' and Arrow's errors as ``VersionGone`` (a file gone) or ``QueryError``."""
    try:
        yield
    except (DeltaError, pa.ArrowException) as exc:
        if gone(exc):
            raise VersionGone(f"a file of a version read is gone (vacuumed): {first_line(exc)}") from exc
        raise QueryError(" ".join(line.strip() for line in str(exc).splitlines() if line.strip())) from exc


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with DataFusion's string and binary views as plain strings and binaries: what
    pandas, polars, Arrow readers and the wire protocol expect.

    >>> plain_schema(pa.schema([("s", pa.string_view())])).field("s").type
    DataType(string)
    """
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    return pa.schema([f.with_type(plain.get(f.type, f.type)) for f in schema])


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
