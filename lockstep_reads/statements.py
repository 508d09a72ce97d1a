"""What a SQL text asks for, before anything runs: its statements, which of them only read,
and the tables each names. The light path speaks PostgreSQL's dialect (parsed here with
sqlglot's ``postgres``; run by DataFusion), so unquoted names fold to lower case.

Only reads run: a write, DDL, COPY or anything else that is not a query is refused here with
the statement's kind, so neither a table nor a file can be changed through a reader.

Example::

    >>> [str(s.kind) for s in split("BEGIN; SELECT * FROM Orders o JOIN returns r USING (id); COMMIT")]
    ['begin', 'query', 'commit']
    >>> tables_named(split("WITH x AS (SELECT 1) SELECT * FROM x, public.Orders, pg_catalog.pg_class")[0].tree)
    ['orders']
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from enum import StrEnum

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Tokenizer, TokenType

from coordinator.domain.errors import LockstepError
from coordinator.domain.lineage import LINEAGE_TABLES
from coordinator.domain.snapshot import HIDDEN

DIALECT = "postgres"
CATALOG_SCHEMAS = ("pg_catalog", "information_schema")
SCHEMA = "public"  # the one schema the tables of a snapshot are in

logging.getLogger("sqlglot").setLevel(logging.ERROR)  # its "falling back to a Command" warnings are ours to judge


class StatementError(LockstepError):
    """The SQL cannot run on a reader: it does not parse, or it is not a read."""


class QueryError(StatementError):
    """The engine (DataFusion, or Spark) could not run the query (unknown column, type error, ...):
    its first line."""


class Refused(StatementError):
    """A write, DDL or other statement that is not a read; readers never change anything."""


class Kind(StrEnum):
    QUERY = "query"  # SELECT, WITH, VALUES, set operations
    BEGIN = "begin"
    COMMIT = "commit"
    ROLLBACK = "rollback"
    SET = "set"
    RESET = "reset"
    SHOW = "show"
    EMPTY = "empty"
    OTHER = "other"  # refused if run


@dataclass(frozen=True)
class Statement:
    text: str  # as the client wrote it: what the engine runs
    tree: exp.Expression | None
    kind: Kind

    @property
    def verb(self) -> str:
        """The statement's first word, upper case (``INSERT``, ``CREATE``): for refusals and tags."""
        return (self.text.split(None, 1) or [""])[0].upper().rstrip(";")

    def require_query(self) -> exp.Expression:
        """The query tree, or ``Refused`` naming what the statement is instead."""
        if self.kind != Kind.QUERY or self.tree is None:
            raise not_a_read(self.verb)
        return self.tree


def not_a_read(verb: str) -> Refused:
    """The refusal of a statement that is not a read, named by its first word."""
    return Refused(f"{verb or 'an empty statement'} is not allowed: Lockstep's tables are read-only here "
                   "(pipelines write them); run SELECT, WITH or VALUES")


def split(sql: str) -> list[Statement]:
    """The statements of ``sql``, split at top-level semicolons, each with its kind. Raises
    ``StatementError`` if a statement does not parse."""
    try:
        tokens = Tokenizer(dialect=DIALECT).tokenize(sql) if sql.strip() else []
    except TokenError as exc:
        raise StatementError(f"the SQL does not parse: {exc}") from exc
    bounds, start = [], 0
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            bounds.append((start, token.start))
            start = token.end + 1
    bounds.append((start, len(sql)))
    texts = [sql[a:b].strip() for a, b in bounds]
    return [classify(text) for text in texts if text] or [Statement("", None, Kind.EMPTY)]


CONTROL = {"BEGIN": Kind.BEGIN, "START": Kind.BEGIN, "COMMIT": Kind.COMMIT, "END": Kind.COMMIT,
           "ROLLBACK": Kind.ROLLBACK, "ABORT": Kind.ROLLBACK, "SHOW": Kind.SHOW, "RESET": Kind.RESET, "SET": Kind.SET}
READS = ("SELECT", "WITH", "VALUES", "TABLE")  # first words of a read (after any parentheses)


def classify(text: str) -> Statement:
    """One statement's kind (see ``Kind``): transaction control, SET, SHOW and RESET by their
    first word (their forms vary more than a parser knows), a query by its parsed tree;
    anything else is ``OTHER``."""
    first = (text.split(None, 1) or [""])[0].upper()
    if first in CONTROL:
        return Statement(text, None, CONTROL[first])
    try:
        tree = sqlglot.parse_one(text, read=DIALECT)
    except (ParseError, TokenError) as exc:
        raise StatementError(f"the SQL does not parse: {first_error(exc)}") from exc
    reads = isinstance(tree, exp.Query | exp.Values) and first.lstrip("(") in READS
    return Statement(text, tree, Kind.QUERY if reads else Kind.OTHER)


def first_error(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if errors:
        e = errors[0]
        return f"{e.get('description', 'syntax error')} at line {e.get('line')}, column {e.get('col')}"
    return str(exc).splitlines()[0]


def folded(identifier: exp.Identifier | None) -> str:
    """An identifier as PostgreSQL names it: unquoted ones fold to lower case."""
    if identifier is None:
        return ""
    return identifier.this if identifier.quoted else identifier.this.lower()


def tables_named(tree: exp.Expression) -> list[str]:
    """The data tables a query reads, sorted: not its CTEs, not catalog or lineage tables.
    Tables may be qualified with the schema ``public``; another schema is not Lockstep's."""
    hidden = next((i.this for i in tree.find_all(exp.Identifier) if str(i.this).lower().startswith(HIDDEN)), None)
    if hidden is not None:  # in any scope: a CTE of that name must not make the raw table readable elsewhere
        raise StatementError(f"{hidden!r} is not a name a read may use: names starting with {HIDDEN} are "
                             "Lockstep's own")
    ctes = {folded(cte.args["alias"].this) for cte in tree.find_all(exp.CTE) if cte.args.get("alias")}
    named: set[str] = set()
    for table in tree.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            continue  # a table function, e.g. generate_series(1, 3)
        name, schema = folded(table.this), folded(table.args.get("db"))
        if schema in CATALOG_SCHEMAS or (not schema and (name in ctes or name in LINEAGE_TABLES)):
            continue
        if schema and schema != SCHEMA:
            raise StatementError(f"schema {schema!r} does not exist: Lockstep's tables are in {SCHEMA!r} "
                                 f"(write {name} or {SCHEMA}.{name})")
        named.add(name)
    return sorted(named)


def lineage_named(tree: exp.Expression) -> bool:
    """Whether a query reads a lineage table (``__meta_*``), built from the coordinator's state."""
    return any(isinstance(t.this, exp.Identifier) and folded(t.this) in LINEAGE_TABLES and not folded(t.args.get("db"))
               for t in tree.find_all(exp.Table))


JVM_CALLS = frozenset({"reflect", "java_method", "try_reflect"})  # Spark SQL functions that call any Java method
# names a table (or a file: IDENTIFIER('csv.`/etc/passwd`')) from a string, out of sight of these checks
NAMED_BY_STRING = "identifier"


def require_spark_read(sql: str) -> None:
    """Refuse Spark SQL that ``lockstep query --engine spark`` must not run: anything but one
    query (writes, DDL, ``ADD JAR``, ``SET``, ``CACHE``), a JVM method call (``reflect``,
    ``java_method``), a file read by its path (``parquet.`/etc```, ```/etc/passwd```) or a name
    made from a string (``IDENTIFIER('csv.`/etc/passwd`')``): a reader names tables only.

    >>> require_spark_read("SELECT shop, SUM(amount) FROM sales GROUP BY shop")
    >>> require_spark_read("SELECT java_method('java.lang.System', 'exit', 1)")
    Traceback (most recent call last):
    ...
    lockstep_reads.statements.Refused: java_method() is not allowed: it calls Java methods; a read runs SQL only
    """
    try:
        trees = [tree for tree in sqlglot.parse(sql, read="spark") if tree is not None]
    except (ParseError, TokenError) as exc:
        raise StatementError(f"the SQL does not parse: {first_error(exc)}") from exc
    if len(trees) != 1:
        raise Refused(f"run one statement at a time (got {len(trees)})")
    tree, first = trees[0], (sql.split(None, 1) or [""])[0].upper().lstrip("(")
    if not (isinstance(tree, exp.Query | exp.Values) and first in READS):
        raise not_a_read(first)
    for call in tree.find_all(exp.Anonymous):
        if call.name.lower() in JVM_CALLS:
            raise Refused(f"{call.name.lower()}() is not allowed: it calls Java methods; a read runs SQL only")
        if call.name.lower() == NAMED_BY_STRING:
            raise Refused("IDENTIFIER() is not allowed: a read names Lockstep's tables in its SQL, not in strings")
    for table in tree.find_all(exp.Table):
        if table.db:
            raise Refused(f"{table.db}.`{table.name}` is not allowed: a read names Lockstep's tables, not files or "
                          "other catalogs")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", table.name or "_"):
            raise Refused(f"`{table.name}` is not allowed: a read names Lockstep's tables, not files")
