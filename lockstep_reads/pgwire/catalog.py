"""Enough of PostgreSQL's catalog for clients to list and describe Lockstep's tables: psql's
``\\dt`` and ``\\d name``, a JDBC driver's ``getTables``/``getColumns``, a BI tool's
``information_schema`` queries, and ``version()``, ``current_database()`` and friends.

A statement that reads ``pg_catalog`` or ``information_schema`` (or calls one of PostgreSQL's
own functions) is rewritten for DataFusion: catalog tables become views over rows made from
the registered tables and their Delta schemas, PostgreSQL's functions and ``::regclass``-style
casts become the values they would have here. Catalog tables Lockstep has nothing in
(policies, triggers, publications, indexes ...) are empty views of the columns the statement
names, so a query over them returns no rows rather than an error.

Example::

    answer(tree, "SELECT relname FROM pg_catalog.pg_class WHERE relkind = 'r'", settings, parameters)  # a pyarrow.Table
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import sqlglot
from sqlglot import exp

from coordinator.client.rest import get_json
from coordinator.client.snapshots import SnapshotError
from coordinator.domain.lineage import LineageTable
from coordinator.domain.snapshot import HIDDEN
from lockstep_reads.engine import run_query
from lockstep_reads.pgwire import types as t
from lockstep_reads.snapshot import versions_for
from lockstep_reads.statements import DIALECT, folded

if TYPE_CHECKING:
    from coordinator.settings import Settings

PG_CATALOG, PUBLIC, INFORMATION_SCHEMA = 11, 2200, 13000
SQL_NAMES = {16: "boolean", 17: "bytea", 20: "bigint", 21: "smallint", 23: "integer", 25: "text", 26: "oid", 114: "json",
             700: "real", 701: "double precision", 1043: "character varying", 1082: "date",
             1083: "time without time zone", 1114: "timestamp without time zone", 1184: "timestamp with time zone",
             1700: "numeric"}
CATALOG_OIDS = {"pg_class": 1259, "pg_namespace": 2615, "pg_attribute": 1249, "pg_type": 1247, "pg_proc": 1255,
                "pg_constraint": 2606, "pg_database": 1262, "pg_description": 2609}
SIZE_FUNCTIONS = ("pg_table_size", "pg_relation_size", "pg_total_relation_size", "pg_database_size", "pg_indexes_size")
TRUE_FUNCTIONS = ("pg_table_is_visible", "pg_type_is_visible", "pg_function_is_visible", "has_table_privilege",
                  "has_schema_privilege", "has_database_privilege", "has_column_privilege", "pg_has_role",
                  "pg_relation_is_publishable")
NULL_FUNCTIONS = ("pg_get_expr", "pg_get_constraintdef", "pg_get_indexdef", "pg_get_viewdef", "pg_get_triggerdef",
                  "pg_get_statisticsobjdef_columns", "col_description", "pg_get_partkeydef", "pg_get_function_result",
                  "pg_get_function_arguments", "pg_tablespace_location", "array_to_string")
OUR_FUNCTIONS = TRUE_FUNCTIONS + NULL_FUNCTIONS + (
    "pg_get_userbyid", "format_type", "obj_description", "pg_encoding_to_char", "current_setting", "pg_backend_pid",
    "current_schemas", "pg_size_pretty", "current_database", "current_catalog") + SIZE_FUNCTIONS
SPECIAL = (exp.CurrentVersion, exp.CurrentUser, exp.SessionUser, exp.CurrentSchema, exp.CurrentCatalog,
           exp.CurrentDatabase)
REG_TYPES = ("regclass", "regtype", "regproc", "regprocedure", "regnamespace", "regrole", "regoper", "oid")


@dataclass(frozen=True)
class Relation:
    name: str
    oid: int
    columns: list[tuple[str, t.PgType, bool]]  # name, type, nullable
    comment: str | None


def relations(settings: Settings) -> list[Relation]:
    """The registered tables that have a Delta table, with their visible columns (newest schema)."""
    found = []
    for name in sorted(get_json(settings, "/topology")["tables"]):
        try:
            table = versions_for(settings).open(settings.table_location(name), None, name)
        except SnapshotError:
            continue  # declared, not written yet
        schema = pa.schema(table.schema().to_arrow())
        columns = [(f.name, t.pg_type(f.type), f.nullable) for f in schema if not f.name.startswith(HIDDEN)]
        found.append(Relation(name, 16384 + zlib.crc32(name.encode()) % 1_000_000_000, columns,
                              table.metadata().description or None))
    return found


def _rows(columns: str, rows: Iterable[tuple[object, ...]]) -> LineageTable:
    """A catalog table from ``"name TYPE, ..."`` and its rows."""
    spec = tuple((c.split()[0], c.split(None, 1)[1]) for c in columns.split(", "))
    return LineageTable(spec, list(rows))


def tables_of(relations: list[Relation], parameters: dict[str, str]) -> dict[str, LineageTable]:
    """Every catalog table this module has rows for, by ``schema.name``."""
    ours = [(r, i + 1, name, kind, nullable) for r in relations for i, (name, kind, nullable) in enumerate(r.columns)]
    types = sorted(t.BY_OID.values(), key=lambda k: k.oid)
    return {
        "pg_catalog.pg_namespace": _rows("oid BIGINT, nspname STRING, nspowner BIGINT",
                                         [(PG_CATALOG, "pg_catalog", 10), (PUBLIC, "public", 10),
                                          (INFORMATION_SCHEMA, "information_schema", 10)]),
        "pg_catalog.pg_class": _rows(
            "oid BIGINT, relname STRING, relnamespace BIGINT, reltype BIGINT, reloftype BIGINT, relowner BIGINT, "
            "relam BIGINT, relfilenode BIGINT, reltablespace BIGINT, relpages BIGINT, reltuples DOUBLE, "
            "reltoastrelid BIGINT, relhasindex BOOLEAN, relisshared BOOLEAN, relpersistence STRING, relkind STRING, "
            "relnatts BIGINT, relchecks BIGINT, relhasrules BOOLEAN, relhastriggers BOOLEAN, relhassubclass BOOLEAN, "
            "relrowsecurity BOOLEAN, relforcerowsecurity BOOLEAN, relispopulated BOOLEAN, relreplident STRING, "
            "relispartition BOOLEAN, relhasoids BOOLEAN",
            [(r.oid, r.name, PUBLIC, 0, 0, 10, 2, r.oid, 0, 0, -1.0, 0, False, False, "p", "r", len(r.columns), 0,
              False, False, False, False, False, True, "d", False, False) for r in relations]),
        "pg_catalog.pg_attribute": _rows(
            "attrelid BIGINT, attname STRING, atttypid BIGINT, attlen BIGINT, attnum BIGINT, atttypmod BIGINT, "
            "attndims BIGINT, attnotnull BOOLEAN, atthasdef BOOLEAN, attidentity STRING, attgenerated STRING, "
            "attisdropped BOOLEAN, attislocal BOOLEAN, attcollation BIGINT, attstattarget BIGINT, attstorage STRING",
            [(r.oid, name, kind.oid, kind.size, n, -1, 0, not nullable, False, "", "", False, True, 0, -1,
              "x" if kind.size < 0 else "p") for r, n, name, kind, nullable in ours]),
        "pg_catalog.pg_type": _rows(
            "oid BIGINT, typname STRING, typnamespace BIGINT, typowner BIGINT, typlen BIGINT, typtype STRING, "
            "typcategory STRING, typrelid BIGINT, typelem BIGINT, typarray BIGINT, typbasetype BIGINT, "
            "typtypmod BIGINT, typnotnull BOOLEAN, typcollation BIGINT, typdelim STRING, typisdefined BOOLEAN, "
            "typinput STRING, typoutput STRING, typreceive STRING, typsend STRING",
            [(k.oid, k.name, PG_CATALOG, 10, k.size, "b", "U", 0, 0, 0, 0, -1, False, 0, ",", True,
              f"{k.name}in", f"{k.name}out", f"{k.name}recv", f"{k.name}send") for k in types]),
        "pg_catalog.pg_database": _rows(
            "oid BIGINT, datname STRING, datdba BIGINT, encoding BIGINT, datcollate STRING, datctype STRING, "
            "datistemplate BOOLEAN, datallowconn BOOLEAN, datconnlimit BIGINT, dattablespace BIGINT",
            [(16384, "lockstep", 10, 6, "C", "C", False, True, -1, 1663)]),
        "pg_catalog.pg_roles": _rows(
            "oid BIGINT, rolname STRING, rolsuper BOOLEAN, rolinherit BOOLEAN, rolcreaterole BOOLEAN, "
            "rolcreatedb BOOLEAN, rolcanlogin BOOLEAN, rolreplication BOOLEAN, rolconnlimit BIGINT, "
            "rolbypassrls BOOLEAN", [(10, "lockstep", False, True, False, False, True, False, -1, False)]),
        "pg_catalog.pg_user": _rows("usename STRING, usesysid BIGINT, usecreatedb BOOLEAN, usesuper BOOLEAN",
                                    [("lockstep", 10, False, False)]),
        "pg_catalog.pg_tablespace": _rows("oid BIGINT, spcname STRING, spcowner BIGINT",
                                          [(1663, "pg_default", 10), (1664, "pg_global", 10)]),
        "pg_catalog.pg_am": _rows("oid BIGINT, amname STRING, amtype STRING", [(2, "heap", "t"), (403, "btree", "i")]),
        "pg_catalog.pg_description": _rows(
            "objoid BIGINT, classoid BIGINT, objsubid BIGINT, description STRING",
            [(r.oid, CATALOG_OIDS["pg_class"], 0, r.comment) for r in relations if r.comment]),
        "pg_catalog.pg_settings": _rows("name STRING, setting STRING, unit STRING, category STRING, vartype STRING",
                                        [(k, v, None, "Lockstep", "string") for k, v in sorted(parameters.items())]),
        "pg_catalog.pg_tables": _rows(
            "schemaname STRING, tablename STRING, tableowner STRING, tablespace STRING, hasindexes BOOLEAN, "
            "hasrules BOOLEAN, hastriggers BOOLEAN, rowsecurity BOOLEAN",
            [("public", r.name, "lockstep", None, False, False, False, False) for r in relations]),
        "information_schema.schemata": _rows("catalog_name STRING, schema_name STRING, schema_owner STRING",
                                             [("lockstep", s, "lockstep") for s in ("public", "pg_catalog",
                                                                                    "information_schema")]),
        "information_schema.tables": _rows(
            "table_catalog STRING, table_schema STRING, table_name STRING, table_type STRING, "
            "is_insertable_into STRING, is_typed STRING",
            [("lockstep", "public", r.name, "BASE TABLE", "NO", "NO") for r in relations]),
        "information_schema.columns": _rows(
            "table_catalog STRING, table_schema STRING, table_name STRING, column_name STRING, "
            "ordinal_position BIGINT, column_default STRING, is_nullable STRING, data_type STRING, udt_name STRING, "
            "character_maximum_length BIGINT, numeric_precision BIGINT, numeric_scale BIGINT, is_updatable STRING",
            [("lockstep", "public", r.name, name, n, None, "YES" if nullable else "NO", SQL_NAMES[kind.oid],
              kind.name, None, None, None, "NO") for r, n, name, kind, nullable in ours]),
    }


def _catalog_name(table: exp.Table) -> str | None:
    """``schema.name`` of a catalog table a query reads, else None."""
    if not isinstance(table.this, exp.Identifier):
        return None
    name, schema = folded(table.this), folded(table.args.get("db"))
    if schema in ("pg_catalog", "information_schema"):
        return f"{schema}.{name}"
    if not schema and name.startswith("pg_"):  # pg_catalog is always on PostgreSQL's search path
        return f"pg_catalog.{name}"
    return None


def _function_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    return None


def asks_catalog(tree: exp.Expression) -> bool:
    """Whether a query reads a catalog table or calls one of PostgreSQL's own functions."""
    return (any(_catalog_name(table) for table in tree.find_all(exp.Table))
            or any(isinstance(node, SPECIAL) or _function_name(node) in OUR_FUNCTIONS for node in tree.walk()))


def answer(tree: exp.Expression, text: str, settings: Settings, parameters: dict[str, str]) -> pa.Table | None:
    """The rows of a catalog statement, or None if ``tree`` is not one."""
    if not asks_catalog(tree):
        return None
    tree = sqlglot.parse_one(re.sub(r"OPERATOR\(pg_catalog\.([^)]+)\)", r"\1", text), read=DIALECT)
    wanted = {name for table in tree.find_all(exp.Table) if (name := _catalog_name(table))}
    rels = relations(settings) if any(n.split(".")[1] in _USES_RELATIONS for n in wanted) else []
    known = tables_of(rels, parameters)
    if _reads_nothing(tree, known):
        names = _output_names(tree)
        return pa.Table.from_arrays([pa.array([], pa.string()) for _ in names], names)
    _name_outputs(tree)
    for node in list(tree.find_all(exp.Subquery, exp.Array)):
        inner = node.find(exp.Select)
        if isinstance(node.parent, exp.From | exp.Join):
            continue  # a derived table: it reads nothing, and so does what reads it (see _reads_nothing)
        if inner is not None and _reads_nothing(inner, known):
            node.replace(exp.null())  # a value looked up where Lockstep has nothing: NULL, as no row gives
    named = {table: name for table in tree.find_all(exp.Table) if (name := _catalog_name(table))}
    referenced: dict[str, set[str]] = {}
    for table, name in named.items():
        referenced.setdefault(name, set()).update(_referenced_columns(tree, table))
    views: dict[str, LineageTable] = {}
    for name, columns in referenced.items():
        rows = known.get(name) or LineageTable((), [])
        extra = tuple((c, "NULL") for c in sorted(columns - {c for c, _ in rows.columns}))
        views["__pg_" + name.replace(".", "_")] = LineageTable(rows.columns + extra, [r + (None,) * len(extra)
                                                                                      for r in rows.rows]) \
            if rows.columns else LineageTable(extra or (("_", "NULL"),), [])
    for table, name in named.items():
        view = "__pg_" + name.replace(".", "_")
        table.replace(exp.Table(this=exp.to_identifier(view), alias=table.args.get("alias")
                                or exp.TableAlias(this=exp.to_identifier(table.name))))
    for node in list(tree.walk())[::-1]:  # children first: a rewritten function's arguments are rewritten already
        new = _rewrite(node, rels, parameters)
        if new is not node:
            tree = new if node is tree else tree
            node.replace(new)
    return run_query(tree.sql(dialect=DIALECT), {}, views)


def _from_tables(select: exp.Select) -> list[exp.Table | exp.Subquery]:
    """The tables and derived tables a SELECT reads rows from: its FROM and inner joins (not
    outer joins' right sides)."""
    tables = [select.args["from_"].this] if select.args.get("from_") else []
    tables += [j.this for j in select.args.get("joins") or [] if (j.side or "").upper() not in ("LEFT", "FULL")]
    return [t for t in tables if isinstance(t, exp.Table | exp.Subquery)]


def _reads_nothing(query: exp.Expression, known: dict[str, LineageTable]) -> bool:
    """Whether a query surely returns no rows: each of its SELECTs reads a catalog table that
    Lockstep has nothing in (policies, triggers, publications ...) in its FROM or an inner join."""
    if isinstance(query, exp.Union):
        return _reads_nothing(query.this, known) and _reads_nothing(query.expression, known)
    if not isinstance(query, exp.Select):
        return False
    return any(_reads_nothing(t.this, known) if isinstance(t, exp.Subquery)
               else bool((name := _catalog_name(t)) and name not in known) for t in _from_tables(query))


def _output_names(query: exp.Expression) -> list[str]:
    select = query
    while isinstance(select, exp.Union):
        select = select.this
    return [e.alias_or_name or "?column?" for e in select.expressions] if isinstance(select, exp.Select) else []


def _name_outputs(tree: exp.Expression) -> None:
    """Name every unnamed expression a SELECT returns (as PostgreSQL would show it), uniquely:
    DataFusion refuses two outputs of one name, which the rewritten functions would give."""
    for select in tree.find_all(exp.Select):
        seen: set[str] = set()
        for i, projection in enumerate(select.expressions):
            if isinstance(projection, exp.Alias | exp.Column | exp.Star):
                seen.add(projection.alias_or_name)
                continue
            function = _function_name(projection.expression if isinstance(projection, exp.Dot) else projection)
            name = function or "?column?"
            name = name if name not in seen else f"{name}_{i}"
            seen.add(name)
            projection.replace(exp.alias_(projection.copy(), name, quoted=True))


_USES_RELATIONS = ("pg_class", "pg_attribute", "pg_description", "pg_tables", "tables", "columns")


def _referenced_columns(tree: exp.Expression, table: exp.Table) -> set[str]:
    """Columns a query names through ``table``'s alias (or unqualified, where it reads one table)."""
    alias = table.alias_or_name
    single = len(list(tree.find_all(exp.Table))) == 1
    return {folded(c.this) for c in tree.find_all(exp.Column)
            if isinstance(c.this, exp.Identifier) and (c.table == alias or (single and not c.table))}


def _rewrite(node: exp.Expression, rels: list[Relation], parameters: dict[str, str]) -> exp.Expression:
    """One node of a catalog statement as DataFusion can run it."""
    if isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) and node.this.name.lower() == "pg_catalog":
        return node.expression  # a function of pg_catalog's, rewritten already
    if isinstance(node, exp.Collate):
        return node.this
    if isinstance(node, exp.Operator):
        operator = str(node.args.get("operator", "")).rsplit(".", 1)[-1]
        regex = exp.RegexpLike(this=node.this, expression=node.expression)
        return regex if operator == "~" else exp.Not(this=regex) if operator == "!~" else node
    if isinstance(node, exp.Cast):
        return _cast(node, rels)
    if isinstance(node, exp.CurrentVersion):
        return exp.Literal.string(f"PostgreSQL {parameters['server_version']} on x86_64-pc-linux-gnu, "
                                  "reading Lockstep's consistent snapshots")
    if isinstance(node, exp.CurrentUser | exp.SessionUser):
        return exp.Literal.string("lockstep")
    if isinstance(node, exp.CurrentSchema):
        return exp.Literal.string("public")
    if isinstance(node, exp.CurrentCatalog | exp.CurrentDatabase):
        return exp.Literal.string("lockstep")
    name = _function_name(node)
    if name is None:
        return node
    args = node.expressions
    if name in TRUE_FUNCTIONS:
        return exp.true()
    if name in NULL_FUNCTIONS:
        return exp.null()
    if name in ("pg_get_userbyid", "current_database", "current_catalog"):
        return exp.Literal.string("lockstep")
    if name == "pg_encoding_to_char":
        return exp.Literal.string("UTF8")
    if name == "pg_backend_pid":
        return exp.Literal.number(os.getpid())
    if name in SIZE_FUNCTIONS:
        return exp.Literal.number(0)
    if name == "pg_size_pretty" and args:
        return exp.func("concat", exp.cast(args[0], "VARCHAR"), exp.Literal.string(" bytes"))
    if name == "current_schemas":
        return exp.Array(expressions=[exp.Literal.string("public")])
    if name == "current_setting" and args and isinstance(args[0], exp.Literal):
        return exp.Literal.string(parameters.get(args[0].name, ""))
    if name == "obj_description" and args:
        comments = [(r.oid, r.comment) for r in rels if r.comment]
        return exp.Case(ifs=[exp.If(this=exp.EQ(this=args[0].copy(), expression=exp.Literal.number(oid)),
                                    true=exp.Literal.string(comment)) for oid, comment in comments]) \
            if comments else exp.null()
    if name == "format_type" and args:
        return exp.Case(this=args[0].copy(), ifs=[exp.If(this=exp.Literal.number(oid), true=exp.Literal.string(sql))
                                                   for oid, sql in SQL_NAMES.items()],
                        default=exp.Literal.string("text"))
    return node


def _cast(node: exp.Cast, rels: list[Relation]) -> exp.Expression:
    """``'name'::regclass`` is that table's oid; casts to the other reg* types keep the number;
    to PostgreSQL's own names of text types, text."""
    target = node.to.sql(dialect=DIALECT).lower().split(".")[-1].strip('"')
    if target in REG_TYPES:
        if isinstance(node.this, exp.Literal) and node.this.is_string:
            wanted = node.this.name.split(".")[-1].strip('"')
            oid = CATALOG_OIDS.get(wanted) or next((r.oid for r in rels if r.name == wanted), 0)
            return exp.Literal.number(oid)
        return node.this
    if target in ("text", "name", '"char"', "char", "varchar", "bpchar"):
        return exp.cast(node.this, "VARCHAR")
    return node
