"""Pipelines in SQL, parsed with sqlglot (Spark dialect) into tables and the jobs that write them.

Three statement forms, as in FLIP-276's examples::

    CREATE TABLE shopping (user_id BIGINT, item_id BIGINT, amount BIGINT, price DOUBLE)
      WITH ('source' = 'kafka:shopping_source', 'format' = 'json', 'primary_key' = 'user_id,item_id');
    CREATE TABLE user_item_amount AS
      SELECT user_id, item_id, SUM(amount) AS total_amount FROM shopping GROUP BY user_id, item_id;
    INSERT INTO existing_table SELECT ...;

Example::

    >>> p = parse_pipeline("CREATE TABLE t (a BIGINT) WITH ('source'='kafka:s', 'format'='json')")
    >>> p.jobs[0].job_id, p.jobs[0].external_topics
    ('ingest_t', ('s',))
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from coordinator.domain.errors import UsageError
from coordinator.domain.validity import column_problem, name_problem

FORMATS = ("json", "avro", "debezium-json")
ROOT_OPTIONS = {"source", "format", "primary_key", "avro_schema", "avro_schema_file"}


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

    @property
    def schema_ddl(self) -> str:
        return ", ".join(c.ddl for c in self.columns)


@dataclass(frozen=True)
class DerivedTable:
    """A table maintained from a query over other tables (CTAS), or an INSERT INTO target."""

    name: str
    query: str
    sources: tuple[str, ...]
    declared_here: bool = True
    if_not_exists: bool = False


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
        roots = tuple(Job(f"ingest_{t.name}", t.name, external_topics=(t.topic,)) for t in self.roots)
        derived = tuple(Job(f"maintain_{t.name}", t.name, sources=t.sources, sql=t.query) for t in self.derived)
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
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PipelineError(f"cannot read pipeline file {path}: {exc.strerror}") from exc
    return parse_pipeline(text, base=Path(path).parent)


def parse_pipeline(text: str, base: Path | None = None) -> Pipeline:
    try:
        statements = [s for s in sqlglot.parse(text, read="spark") if s is not None]
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
        if isinstance(statement, exp.Create) and statement.kind == "TABLE":
            if isinstance(statement.expression, exp.Query):
                derived.append(_derived(statement, where))
            else:
                roots.append(_root(statement, where, base))
        elif isinstance(statement, exp.Insert) and isinstance(statement.expression, exp.Query):
            if not isinstance(statement.this, exp.Table | exp.Schema):
                raise PipelineError(f"{where}: INSERT INTO writes a table of the pipeline "
                                    f"(INSERT INTO t SELECT ...), not {statement.this.key.upper()}")
            target = statement.this if isinstance(statement.this, exp.Table) else statement.this.this
            name = _name(target.name, where)
            if statement.args.get("overwrite"):
                raise PipelineError(f"{where}: INSERT OVERWRITE would replace {name} at every barrier, but Lockstep "
                                    f"maintains it incrementally; write INSERT INTO {name} SELECT ... (or CREATE TABLE "
                                    f"{name} AS SELECT ...)")
            query = _query(statement.expression, where)
            derived.append(DerivedTable(name, query.sql(dialect="spark"), tables_read(query), declared_here=False))
        else:
            raise PipelineError(
                f"{where}: only CREATE TABLE ... WITH (...), CREATE TABLE ... AS SELECT and "
                "INSERT INTO ... SELECT belong in a pipeline"
            )
    names = [t.name for t in (*roots, *derived)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise PipelineError(f"table(s) defined more than once: {', '.join(duplicates)} (one writer per table)")
    return Pipeline(tuple(roots), tuple(derived))


def _statement_lines(text: str) -> list[int]:
    """The line each statement starts on (1-based), for messages that say where to look."""
    lines, starting = [], True
    for token in sqlglot.Dialect.get_or_raise("spark").tokenize(text):
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


def _options(statement: exp.Create, where: str) -> dict[str, str]:
    props = statement.args.get("properties")
    options: dict[str, str] = {}
    for prop in props.expressions if props else []:
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
    name = _name(schema.this.name, where)
    columns = tuple(
        Column(col.name, col.args["kind"].sql(dialect="spark").upper())
        for col in schema.expressions
        if isinstance(col, exp.ColumnDef)
    )
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
    missing = [k for k in key if k not in {c.name for c in columns}]
    if missing:
        raise PipelineError(f"{where}: primary key column(s) {', '.join(missing)} are not columns of {name}")
    if fmt == "debezium-json" and not key:
        raise PipelineError(f"{where}: format debezium-json needs a 'primary_key' to apply updates and deletes")
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
    return RootTable(name, columns, source[len("kafka:"):], fmt, key, avro_schema)


def _derived(statement: exp.Create, where: str) -> DerivedTable:
    target = statement.this
    name = _name(target.name if isinstance(target, exp.Table) else target.this.name, where)
    query = _query(statement.expression, where)
    return DerivedTable(name, query.sql(dialect="spark"), tables_read(query), True, bool(statement.args.get("exists")))


def _query(query: exp.Query, where: str) -> exp.Query:
    """``query`` if every column it outputs has a name a Lockstep column may have (``*`` takes
    its sources' names, checked where they are declared); else a PipelineError saying which."""
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
