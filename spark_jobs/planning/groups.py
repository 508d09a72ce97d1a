"""Queries over one table whose result falls apart into groups of that table's rows: HAVING,
Top-N per group (``ROW_NUMBER() OVER (PARTITION BY ...)``), DISTINCT, windowed and nested
aggregates, subqueries and CTEs in FROM. Pure query analysis with sqlglot.

If every GROUP BY, PARTITION BY and DISTINCT of the query includes the same source columns
(the *group columns*, passed through unchanged to the result), then the result rows of a group
depend on that group's source rows only. So a barrier recomputes just the groups its changes
touch, from the source rows of those groups, and replaces their rows in the table
(``spark_jobs.runtime.ivm``); the rest of the table is not read again.

Example::

    >>> import sqlglot
    >>> from coordinator.spark_sql import SPARK
    >>> top3 = sqlglot.parse_one(
    ...     "SELECT * FROM (SELECT auction, bidder, price, ROW_NUMBER() OVER "
    ...     "(PARTITION BY auction ORDER BY price DESC) AS rn FROM bids) WHERE rn <= 3", read=SPARK)
    >>> groups_of(top3, "bids", source_key=None)
    Groups(columns=('auction',), key=('auction', 'rn'))
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from coordinator.domain.errors import LockstepError
from coordinator.spark_sql import SPARK

SOURCE = "source"  # a FROM item that is the source table itself


class NotGrouped(LockstepError):
    """The query's result does not fall into groups of source rows; the message says why."""


@dataclass(frozen=True)
class Groups:
    """``columns``: source columns every group of the query includes, selected unchanged;
    ``key``: result columns that identify a row."""

    columns: tuple[str, ...]
    key: tuple[str, ...]


def groups_of(tree: exp.Select, source: str, source_key: tuple[str, ...] | None) -> Groups:
    """The group columns and key of ``tree``, a query over the one table ``source``."""
    scope = _Scope(source, {cte.alias: cte.this for cte in tree.find_all(exp.CTE)})
    lists: list[list[str]] = []
    for select in tree.find_all(exp.Select):
        scope.check_nesting(select)
        lists += scope.partitions(select)
    if not lists:
        raise NotGrouped("nothing in it groups the rows (no GROUP BY, PARTITION BY or DISTINCT)")
    columns = [c for c in lists[0] if all(c in other for other in lists[1:])]
    if not columns:
        raise NotGrouped(f"its GROUP BY / PARTITION BY / DISTINCT lists share no column of {source} "
                         f"({'; '.join(', '.join(x) or '-' for x in lists)})")
    for select in tree.find_all(exp.Select):
        scope.check_joins(select, columns)
    missing = [c for c in columns if not scope.passes(tree, c)]
    if missing:
        raise NotGrouped(f"the result does not select {', '.join(missing)} as it is, so the rows of a group "
                         "could not be found in the table")
    return Groups(tuple(dict.fromkeys(columns)), _key(tree, scope, source_key, columns))


def _key(tree: exp.Select, scope: _Scope, source_key: tuple[str, ...] | None, columns: list[str]) -> tuple[str, ...]:
    """Result columns that identify a row: the GROUP BY columns or the DISTINCT list of the
    outermost SELECT, else (no joins) the source's key or a ROW_NUMBER with its partition."""
    items = tree.expressions
    if tree.args.get("group"):
        group = {g.sql(dialect=SPARK) for g in tree.args["group"].expressions}
        names = [i.alias_or_name for i in items if i.unalias().sql(dialect=SPARK) in group or i.alias in group]
        if len(names) != len(group):
            raise NotGrouped("a GROUP BY expression of the outermost SELECT is not selected, so the table has no key")
        return tuple(names)
    if tree.args.get("distinct"):  # (its items are named: a DISTINCT * would have held no group column)
        return tuple(i.alias_or_name for i in items)
    if not any(s.args.get("joins") for s in tree.find_all(exp.Select)):
        if source_key and all(scope.passes(tree, k) for k in source_key):
            return source_key
        for window in tree.find_all(exp.Window):
            alias = window.parent
            if isinstance(window.this, exp.RowNumber) and isinstance(alias, exp.Alias):
                key = (*[c.name for c in window.args.get("partition_by") or []], alias.alias)
                if set(key[:-1]) <= set(columns) and all(scope.exposes(tree, k) for k in key):
                    return key
    raise NotGrouped("the result has no key: select the GROUP BY columns, the source's key, or a "
                     "ROW_NUMBER() with its PARTITION BY columns")


@dataclass(frozen=True)
class _Scope:
    """Which FROM item a column comes from, through subqueries and CTEs, down to the source."""

    source: str
    ctes: dict[str, exp.Expression]

    def relations(self, select: exp.Select) -> dict[str, exp.Expression | str]:
        """alias -> SOURCE or the query behind it, for FROM and every JOIN of ``select``."""
        items = [select.args["from_"].this] if select.args.get("from_") else []
        items += [j.this for j in select.args.get("joins") or []]
        out: dict[str, exp.Expression | str] = {}
        for item in items:
            if isinstance(item, exp.Table):
                out[item.alias_or_name] = self.ctes.get(item.name, SOURCE)
            elif isinstance(item, exp.Subquery):
                out[item.alias_or_name] = item.this
            else:
                raise NotGrouped(f"FROM {item.sql(dialect=SPARK)} is neither a table nor a subquery")
        return out

    def holds(self, select: exp.Select, column: exp.Column) -> bool:
        """Does ``column``, in ``select``, hold the source column of the same name, unchanged?"""
        name = column.name
        if not column.table and any(i.alias == name and not _plain(i.unalias(), name) for i in select.expressions):
            return False  # an alias of a computed select item (GROUP BY h where h = date_trunc(...))
        relations = self.relations(select)
        if column.table:
            chosen = [relations[column.table]] if column.table in relations else []
        elif len(relations) == 1:
            chosen = list(relations.values())
        else:
            raise NotGrouped(f"column {name} in a join: qualify it with its table")
        return any(body == SOURCE or self.passes(body, name) for body in chosen)

    def passes(self, body: exp.Expression | str, name: str) -> bool:
        """Does the query ``body`` output the source column ``name`` unchanged, under that name?"""
        if body == SOURCE:
            return True
        if not isinstance(body, exp.Select):
            return False
        for item in body.expressions:
            node = item.unalias()
            if item.alias_or_name == name and _plain(node, name):
                return self.holds(body, node)
            if item.is_star:
                relations = self.relations(body)
                table = node.table if isinstance(node, exp.Column) else ""
                if any(self.passes(b, name) for a, b in relations.items() if not table or a == table):
                    return True
        return False

    def exposes(self, body: exp.Expression | str, name: str) -> bool:
        """Does ``body`` output a column called ``name`` (whatever it computes)?"""
        if not isinstance(body, exp.Select):
            return body == SOURCE
        if any(i.alias_or_name == name and not i.is_star for i in body.expressions):
            return True
        return any(i.is_star and any(self.exposes(b, name) for b in self.relations(body).values())
                   for i in body.expressions)

    def partitions(self, select: exp.Select) -> list[list[str]]:
        """The source columns each GROUP BY, DISTINCT and window PARTITION BY of ``select`` holds."""
        out: list[list[str]] = []
        if select.args.get("group"):
            out.append([g.name for g in select.args["group"].expressions
                        if isinstance(g, exp.Column) and self.holds(select, g)])
        elif any(not a.find_ancestor(exp.Window) for i in select.expressions for a in i.find_all(exp.AggFunc)):
            raise NotGrouped(f"{select.sql(dialect=SPARK)[:80]} aggregates all its rows into one (no GROUP BY)")
        if select.args.get("distinct"):
            out.append([i.unalias().name for i in select.expressions
                        if isinstance(i.unalias(), exp.Column) and self.holds(select, i.unalias())])
        for window in select.find_all(exp.Window):
            if window.find_ancestor(exp.Select) is not select:
                continue
            partition = window.args.get("partition_by") or []
            if not partition:
                raise NotGrouped(f"window function {window.sql(dialect=SPARK)} has no PARTITION BY: every row "
                                 "depends on all others")
            out.append([p.name for p in partition if isinstance(p, exp.Column) and self.holds(select, p)])
        return out

    def check_nesting(self, select: exp.Select) -> None:
        """A subquery may stand in FROM, JOIN or WITH only (not in WHERE or the select list)."""
        parent = select.parent
        if parent is None or isinstance(parent, exp.CTE):
            return
        if isinstance(parent, exp.Subquery) and isinstance(parent.parent, exp.From | exp.Join):
            return
        raise NotGrouped(f"subquery {select.sql(dialect=SPARK)[:60]} stands outside FROM/JOIN/WITH")

    def check_joins(self, select: exp.Select, columns: list[str]) -> None:
        """A join must match rows of one group only: it equates every group column of both sides."""
        for join in select.args.get("joins") or []:
            on = join.args.get("on")
            pairs = {(c.this.name, c.expression.name) for c in (on.flatten() if isinstance(on, exp.And) else [on])
                     if isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)}
            using = {i.name for i in join.args.get("using") or []}
            missing = [c for c in columns if (c, c) not in pairs and c not in using]
            if missing:
                raise NotGrouped(f"JOIN {join.this.sql(dialect=SPARK)[:60]} does not match {', '.join(missing)} "
                                 "on both sides, so it could join rows of different groups")


def _plain(node: exp.Expression, name: str) -> bool:
    return isinstance(node, exp.Column) and node.name == name and not node.is_star
