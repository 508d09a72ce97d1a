"""Pipelines in SQL, parsed with sqlglot (Spark dialect) into tables and the jobs that write them.

Three statement forms, as in FLIP-276's examples::

    CREATE TABLE shopping (user_id BIGINT, item_id BIGINT, amount BIGINT, price DOUBLE)
      WITH ('source' = 'kafka:shopping_source', 'format' = 'json', 'primary_key' = 'user_id,item_id');
    CREATE TABLE user_item_amount AS
      SELECT user_id, item_id, SUM(amount) AS total_amount FROM shopping GROUP BY user_id, item_id;
    INSERT INTO existing_table SELECT ...;

Idioms from Flink and Databricks mean what users expect there: ``CREATE MATERIALIZED VIEW v AS
SELECT`` is a maintained table like ``CREATE TABLE v AS SELECT``; ``PRIMARY KEY (k) NOT
ENFORCED`` in a root table's columns is its ``'primary_key'``; ``CREATE OR REPLACE`` is what
running a changed pipeline does anyway (new barriers use the new query); ``default.t`` and
``spark_catalog.default.t`` are ``t``. What Lockstep cannot honour (a plain view, ``FROM STREAM
t``, time travel, other databases, constraints it does not enforce, options on a maintained
table) is rejected with what to write instead, never silently read another way.

A pipeline may also be a Python file of decorated functions (``spark_jobs.planning.python_tables``),
and ``joined`` makes several files' pipelines, SQL and Python, one.

Example::

    >>> p = parse_pipeline("CREATE TABLE t (a BIGINT) WITH ('source'='kafka:s', 'format'='json')")
    >>> p.jobs[0].job_id, p.jobs[0].external_topics
    ('ingest_t', ('s',))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from coordinator.domain.errors import UsageError
from coordinator.domain.starts import EARLIEST, start_problem
from coordinator.domain.validity import column_problem, name_problem
from coordinator.spark_sql import SPARK
from spark_jobs.planning.python_tables import PythonTable, load_python_tables

FORMATS = ("json", "avro", "debezium-json", "avro-confluent", "debezium-avro-confluent")
ROOT_OPTIONS = {"source", "format", "primary_key", "avro_schema", "avro_schema_file", "transactions", "start"}


class PipelineError(UsageError, ValueError):
    """A pipeline file cannot be used; the message names the statement and what to change."""


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # Spark SQL type, e.g. BIGINT, DOUBLE, STRING

    @property
    def ddl(self) -> str:
        return f"`{self.name}` {self.type}"


@dataclass(frozen=True)
class RootTable:
    name: str
    columns: tuple[Column, ...]
    topic: str
    format: str = "json"
    primary_key: tuple[str, ...] = ()
    avro_schema: str | None = None
    # Debezium's transaction topic: a barrier holds whole source transactions (option 'transactions')
    transactions: str | None = None
    # where a new table starts reading its topics (option 'start': coordinator.domain.starts)
    start: str = EARLIEST

    @property
    def schema_ddl(self) -> str:
        return ", ".join(c.ddl for c in self.columns)

    @property
    def topics(self) -> tuple[str, ...]:
        """The Kafka topics its barriers cut: its own, and its source's transaction topic."""
        return (self.topic, self.transactions) if self.transactions else (self.topic,)

    @property
    def collection(self) -> str:
        """The source table as Debezium's END markers name it (``schema.table``: the last two
        parts of a topic named ``<prefix>.<schema>.<table>``)."""
        return ".".join(self.topic.split(".")[-2:])


@dataclass(frozen=True)
class DerivedTable:
    """A table maintained from a query over other tables (CTAS), or an INSERT INTO target; or from
    a Python function (``python``; ``query`` is then the function's code, its fingerprint)."""

    name: str
    query: str
    sources: tuple[str, ...]
    declared_here: bool = True
    if_not_exists: bool = False
    python: PythonTable | None = field(default=None, compare=False)
    # WITH ('state' = 'keyed'): kept in Spark's state store by key (``spark_jobs.runtime.maintenance.keyed``)
    keyed: bool = False
    # WITH ('layout' = 'changelog'): a barrier's changed rows appended, readers keep each key's newest
    changelog: bool = False


@dataclass(frozen=True)
class Job:
    job_id: str
    sink: str
    sources: tuple[str, ...] = ()
    external_topics: tuple[str, ...] = ()
    sql: str = ""


@dataclass(frozen=True)
class Pipeline:
    roots: tuple[RootTable, ...]
    derived: tuple[DerivedTable, ...]

    @property
    def jobs(self) -> tuple[Job, ...]:
        roots = tuple(Job(f"ingest_{t.name}", t.name, external_topics=t.topics) for t in self.roots)
        derived = tuple(Job(f"maintain_{t.name}", t.name, sources=t.sources, sql="" if t.python else t.query)
                        for t in self.derived)
        return roots + derived

    def without(self, names: set[str]) -> Pipeline:
        """This pipeline minus the derived tables named (and so their jobs)."""
        return Pipeline(self.roots, tuple(t for t in self.derived if t.name not in names)) if names else self

    def table(self, name: str) -> RootTable | DerivedTable:
        for t in (*self.roots, *self.derived):
            if t.name == name:
                return t
        raise KeyError(name)


def load_pipeline(path: Path) -> Pipeline:
    """A pipeline file: SQL, or Python (``.py``) with decorated functions."""
    path = Path(path)
    if path.suffix == ".py":
        if not path.is_file():
            raise PipelineError(f"cannot read pipeline file {path}: no such file")
        try:
            tables = load_python_tables(path)
        except ValueError as exc:
            raise PipelineError(str(exc)) from exc
        return Pipeline((), tuple(DerivedTable(t.name, t.source_text, t.sources, python=t) for t in tables))
    try:
        text = path.read_text()
    except OSError as exc:
        raise PipelineError(f"cannot read pipeline file {path}: {exc.strerror}") from exc
    return parse_pipeline(text, base=path.parent)


def joined(pipelines: Sequence[Pipeline]) -> Pipeline:
    """Several files' pipelines as one (a Python file's functions read a SQL file's tables)."""
    whole = Pipeline(tuple(t for p in pipelines for t in p.roots), tuple(t for p in pipelines for t in p.derived))
    names = [t.name for t in (*whole.roots, *whole.derived)]
    if duplicates := sorted({n for n in names if names.count(n) > 1}):
        raise PipelineError(f"table(s) defined in more than one place: {', '.join(duplicates)} (one writer per table)")
    return whole


def parse_pipeline(text: str, base: Path | None = None) -> Pipeline:
    try:
        statements = [s for s in sqlglot.parse(text, read=SPARK) if s is not None]
        lines = _statement_lines(text)
    except (ParseError, TokenError) as exc:
        raise PipelineError(f"SQL syntax error: {exc}") from exc
    if not statements:
        raise PipelineError("the pipeline has no statements")
    if len(lines) != len(statements):
        lines = []  # (a statement of comments only) name statements by number then
    roots: list[RootTable] = []
    derived: list[DerivedTable] = []
    for number, statement in enumerate(statements, start=1):
        at = f"line {lines[number - 1]}" if lines else f"statement {number}"
        where = f"{at} ({statement.sql(dialect='spark')[:60]}...)"
        if isinstance(statement, exp.Create) and statement.kind == "VIEW":
            derived.append(_view(statement, where))
        elif isinstance(statement, exp.Create) and statement.kind == "TABLE":
            if isinstance(statement.expression, exp.Query):
                derived.append(_derived(statement, where))
            else:
                roots.append(_root(statement, where, base))
        elif isinstance(statement, exp.Insert) and isinstance(statement.expression, exp.Query):
            if not isinstance(statement.this, exp.Table | exp.Schema):
                raise PipelineError(f"{where}: INSERT INTO writes a table of the pipeline "
                                    f"(INSERT INTO t SELECT ...), not {statement.this.key.upper()}")
            target = statement.this if isinstance(statement.this, exp.Table) else statement.this.this
            name = _table_name(target, where)
            if statement.args.get("overwrite"):
                raise PipelineError(f"{where}: INSERT OVERWRITE would replace {name} at every barrier, but Lockstep "
                                    f"maintains it incrementally; write INSERT INTO {name} SELECT ... (or CREATE TABLE "
                                    f"{name} AS SELECT ...)")
            query = _query(statement.expression, where)
            derived.append(DerivedTable(name, query.sql(dialect=SPARK), tables_read(query), declared_here=False))
        else:
            raise PipelineError(
                f"{where}: only CREATE TABLE ... WITH (...), CREATE TABLE ... AS SELECT (or CREATE MATERIALIZED "
                "VIEW ... AS SELECT) and INSERT INTO ... SELECT belong in a pipeline"
            )
    names = [t.name for t in (*roots, *derived)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise PipelineError(f"table(s) defined more than once: {', '.join(duplicates)} (one writer per table)")
    return Pipeline(tuple(roots), tuple(derived))


def _statement_lines(text: str) -> list[int]:
    """The line each statement starts on (1-based), for messages that say where to look."""
    lines, starting = [], True
    for token in SPARK().tokenize(text):
        if token.token_type == TokenType.SEMICOLON:
            starting = True
        elif starting:
            lines.append(token.line)
            starting = False
    return lines


def _name(name: str, where: str) -> str:
    """``name`` if it may name a table (``coordinator.domain.validity``), else a PipelineError."""
    if (problem := name_problem("table name", name)) is not None:
        raise PipelineError(f"{where}: {problem}")
    return name


def _table_name(table: exp.Table, where: str) -> str:
    """The name of a pipeline table that ``table`` refers to: ``t``, ``default.t`` or
    ``spark_catalog.default.t`` (where Lockstep registers its tables); anything else is an error."""
    if not isinstance(table.this, exp.Identifier):
        function = table.this.sql(dialect=SPARK)
        if isinstance(table.this, exp.Anonymous) and table.this.name.upper() == "STREAM":
            raise PipelineError(f"{where}: {function} is a streaming read in Databricks; Lockstep reads every "
                                f"table of a query barrier by barrier already: write FROM {table.this.expressions[0].sql()}")
        raise PipelineError(f"{where}: {function} is not a table; a Lockstep query reads tables of the pipeline")
    if table.name.upper() == "STREAM" and not table.this.quoted and table.alias:
        raise PipelineError(f"{where}: FROM STREAM {table.alias} is a streaming read in Databricks; Lockstep reads "
                            f"every table of a query barrier by barrier already: write FROM {table.alias}")
    if table.args.get("version") is not None:
        raise PipelineError(f"{where}: {table.sql(dialect='spark')} reads a fixed version of {table.name}, but a "
                            "maintained query reads each barrier's version; read old versions with lockstep query "
                            "--at-barrier instead")
    if table.catalog.lower() not in ("", "spark_catalog") or table.db.lower() not in ("", "default"):
        qualified = ".".join(part for part in (table.catalog, table.db, table.name) if part)
        raise PipelineError(f"{where}: {qualified}: Lockstep's tables live in the database default (LOCKSTEP_METASTORE "
                            f"names them there); write {table.name}")
    return _name(table.name, where)


def _options(statement: exp.Create, where: str) -> dict[str, str]:
    props = statement.args.get("properties")
    return _property_options(props.expressions if props else [], where)


def _property_options(props: list[exp.Expression], where: str) -> dict[str, str]:
    """``WITH ('key' = 'value', ...)`` as a dict with lower-case keys."""
    options: dict[str, str] = {}
    for prop in props:
        if not isinstance(prop, exp.Property):
            raise PipelineError(f"{where}: unsupported table property {prop.sql()}; use WITH ('key' = 'value', ...)")
        key = prop.name if isinstance(prop.this, exp.Literal | exp.Identifier | exp.Var) else prop.this.sql()
        value = prop.args["value"]
        options[key.lower()] = value.name if isinstance(value, exp.Literal | exp.Identifier | exp.Var) else value.sql()
    return options


def _root(statement: exp.Create, where: str, base: Path | None) -> RootTable:
    schema = statement.this
    if not isinstance(schema, exp.Schema):
        raise PipelineError(f"{where}: a root table needs its columns, e.g. CREATE TABLE t (id BIGINT, ...)")
    name = _table_name(schema.this, where)
    columns, declared_key = _columns(schema, where)
    for column in columns:
        if (problem := column_problem(column.name)) is not None:
            raise PipelineError(f"{where}: {problem}")
    options = _options(statement, where)
    unknown = sorted(set(options) - ROOT_OPTIONS)
    if unknown:
        raise PipelineError(f"{where}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(ROOT_OPTIONS))}")
    source = options.get("source", "")
    if not source.startswith("kafka:") or len(source) <= len("kafka:"):
        raise PipelineError(f"{where}: table {name} needs 'source' = 'kafka:<topic>'")
    fmt = options.get("format", "json")
    if fmt not in FORMATS:
        raise PipelineError(f"{where}: format {fmt!r} is not supported; use one of {', '.join(FORMATS)}")
    key = tuple(k.strip() for k in options.get("primary_key", "").split(",") if k.strip())
    if declared_key and key and declared_key != key:
        raise PipelineError(f"{where}: PRIMARY KEY ({', '.join(declared_key)}) and 'primary_key' = "
                            f"'{','.join(key)}' differ; declare the key once")
    key = key or declared_key
    missing = [k for k in key if k not in {c.name for c in columns}]
    if missing:
        raise PipelineError(f"{where}: primary key column(s) {', '.join(missing)} are not columns of {name}")
    if fmt.startswith("debezium-") and not key:
        raise PipelineError(f"{where}: format {fmt} needs a 'primary_key' to apply updates and deletes")
    avro_schema = options.get("avro_schema")
    if "avro_schema_file" in options:
        path = Path(options["avro_schema_file"])
        path = (base / path) if base and not path.is_absolute() else path
        try:
            avro_schema = path.read_text()
        except OSError as exc:
            raise PipelineError(f"{where}: cannot read avro_schema_file {path}: {exc.strerror}") from exc
    if fmt == "avro" and not avro_schema:
        raise PipelineError(f"{where}: format avro needs 'avro_schema' or 'avro_schema_file'")
    topic = source[len("kafka:"):]
    start = options.get("start", EARLIEST).strip().lower()
    if (problem := start_problem(start)) is not None:
        raise PipelineError(f"{where}: table {name}: {problem}")
    return RootTable(name, columns, topic, fmt, key, avro_schema, _transactions(options, fmt, topic, where), start)


def _transactions(options: dict[str, str], fmt: str, topic: str, where: str) -> str | None:
    """The transaction topic of option ``'transactions' = 'kafka:<prefix>.transaction'``."""
    if "transactions" not in options:
        return None
    value = options["transactions"]
    if not value.startswith("kafka:") or len(value) <= len("kafka:"):
        raise PipelineError(f"{where}: 'transactions' names Debezium's transaction topic: 'transactions' = "
                            f"'kafka:<topic.prefix>.transaction'")
    if not fmt.startswith("debezium-"):
        raise PipelineError(f"{where}: 'transactions' needs a Debezium format (debezium-json or "
                            f"debezium-avro-confluent), not {fmt}")
    if topic.count(".") < 2:
        raise PipelineError(f"{where}: with 'transactions', the source topic must be Debezium's "
                            f"<topic.prefix>.<schema>.<table> (its END markers count events per schema.table), "
                            f"not {topic}")
    return value[len("kafka:"):]


def _columns(schema: exp.Schema, where: str) -> tuple[tuple[Column, ...], tuple[str, ...]]:
    """A root table's columns, and its key if declared as ``PRIMARY KEY (...) [NOT ENFORCED]``
    (in the column list or on one column): Lockstep keeps the newest row per key, as an
    upsert source does in Flink, and checks no uniqueness (so ``NOT ENFORCED`` is optional)."""
    columns: list[Column] = []
    key: tuple[str, ...] = ()
    for item in schema.expressions:
        if isinstance(item, exp.PrimaryKey):
            key = tuple(k.name for k in item.expressions)
        elif isinstance(item, exp.ColumnDef):
            columns.append(Column(item.name, item.args["kind"].sql(dialect=SPARK).upper()))
            for constraint in item.constraints:
                if isinstance(constraint.kind, exp.PrimaryKeyColumnConstraint):
                    key = (item.name,)
                elif not isinstance(constraint.kind, exp.CommentColumnConstraint):
                    raise PipelineError(f"{where}: column {item.name}: {constraint.sql(dialect='spark')} is not "
                                        "enforced by Lockstep; remove it (rows that break it would still be written)")
        else:
            raise PipelineError(f"{where}: {item.sql(dialect='spark')} is not a column; a root table lists its "
                                "columns and at most a PRIMARY KEY (...) NOT ENFORCED")
    return tuple(columns), key


def _view(statement: exp.Create, where: str) -> DerivedTable:
    """``CREATE MATERIALIZED VIEW v AS SELECT``: a maintained table. A plain view is rejected."""
    props = statement.args.get("properties")
    if not props or not any(isinstance(p, exp.MaterializedProperty) for p in props.expressions):
        name = statement.this.sql(dialect=SPARK)
        raise PipelineError(f"{where}: a plain view is computed at each read, not kept consistent across tables; "
                            f"write CREATE MATERIALIZED VIEW {name} AS SELECT ... (a table Lockstep maintains)")
    return _derived(statement, where)


def _derived(statement: exp.Create, where: str) -> DerivedTable:
    target = statement.this
    if isinstance(target, exp.Schema):
        raise PipelineError(f"{where}: a maintained table takes its columns from its query; write CREATE TABLE "
                            f"{target.this.sql(dialect='spark')} AS SELECT ... without a column list")
    name = _table_name(target, where)
    props = statement.args.get("properties")
    given = [p for p in (props.expressions if props else []) if not isinstance(p, exp.MaterializedProperty)]
    plain = [p for p in given if type(p) is exp.Property]  # WITH ('key' = 'value'), not USING, TEMPORARY ...
    options = _property_options(plain, where)
    if len(plain) < len(given) or set(options) - {"state", "layout"} or options.get("state", "keyed") != "keyed" \
            or options.get("layout", "in-place") not in ("in-place", "changelog"):
        raise PipelineError(f"{where}: {', '.join(p.sql(dialect='spark') for p in given)}: a maintained table takes "
                            "no options (it is a Delta table Lockstep keeps at every barrier) but WITH ('state' = "
                            "'keyed') (a join's rows or an aggregate's groups kept by key in Spark's state store) and "
                            "'layout' = 'in-place' (the default) or 'changelog'; remove the others")
    changelog = options.get("layout") == "changelog"
    if changelog and "state" not in options:
        raise PipelineError(f"{where}: WITH ('layout' = 'changelog') is a layout of a keyed aggregate's table; "
                            "add 'state' = 'keyed' or remove the layout")
    query = _query(statement.expression, where)
    return DerivedTable(name, query.sql(dialect=SPARK), tables_read(query), True, bool(statement.args.get("exists")),
                        keyed="state" in options, changelog=changelog)


def _query(query: exp.Query, where: str) -> exp.Query:
    """``query`` if every column it outputs has a name a Lockstep column may have (``*`` takes
    its sources' names, checked where they are declared) and every table it reads is a pipeline
    table (written unqualified, as the job reads each barrier's version under that name); else
    a PipelineError saying which."""
    ctes = {cte.alias for cte in query.find_all(exp.CTE)}
    for table in query.find_all(exp.Table):
        if table.name not in ctes or not isinstance(table.this, exp.Identifier):
            _table_name(table, where)
            table.set("db", None)
            table.set("catalog", None)
    for position, column in enumerate(query.selects, start=1):
        if isinstance(column, exp.Star) or (isinstance(column, exp.Column) and column.is_star):
            continue
        name = column.alias if isinstance(column, exp.Alias) else column.name if isinstance(column, exp.Column) else ""
        if not name:
            raise PipelineError(f"{where}: output column {position} ({column.sql(dialect='spark')}) has no name; "
                                "name it, e.g. SUM(amount) AS total_amount")
        problem = column_problem(name)
        if problem:
            raise PipelineError(f"{where}: {problem}")
    return query


def tables_read(query: exp.Query) -> tuple[str, ...]:
    """Tables a query reads, without its own CTE names, sorted."""
    ctes = {cte.alias for cte in query.find_all(exp.CTE)}
    seen: list[str] = []
    for table in query.find_all(exp.Table):
        if table.name not in ctes and table.name not in seen:
            seen.append(table.name)
    return tuple(sorted(seen))
