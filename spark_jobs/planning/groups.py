"""Queries whose result falls apart into groups of their sources' rows: HAVING, Top-N per group
(``ROW_NUMBER() OVER (PARTITION BY ...)``), DISTINCT, windowed and nested aggregates,
subqueries and CTEs in FROM, over one table or over tables joined on the group columns (a
table's rows with the top bid of each auction). Pure query analysis with sqlglot.

If every GROUP BY, PARTITION BY and DISTINCT of the query includes the same *group columns*
(one source column, or source columns that its joins make equal: ``bids.auction = auctions.id``),
every join matches rows of one group only, and the result selects the group columns unchanged,
then the result rows of a group depend on that group's source rows only. So a barrier
recomputes just the groups its changes touch, from the source rows of those groups, and
replaces their rows in the table (``spark_jobs.runtime.ivm``).

Example::

    >>> import sqlglot
    >>> from coordinator.spark_sql import SPARK
    >>> top3 = sqlglot.parse_one(
    ...     "SELECT * FROM (SELECT auction, bidder, price, ROW_NUMBER() OVER "
    ...     "(PARTITION BY auction ORDER BY price DESC) AS rn FROM bids) WHERE rn <= 3", read=SPARK)
    >>> groups_of(top3, ("bids",), keys={})
    Groups(columns=('auction',), sources={'bids': ('auction',)}, key=('auction', 'rn'))
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import sqlglot
import sqlglot.errors
from sqlglot import exp

from coordinator.domain.errors import LockstepError
from coordinator.spark_sql import SPARK

Member = tuple[str, str]  # (source table, column or the SQL of an expression of its columns)
_RANDOM = {"rand", "randn", "random", "uuid", "shuffle", "current_timestamp", "now"}
_SIMPLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class NotGrouped(LockstepError):
    """The query's result does not fall into groups of source rows; the message says why."""


@dataclass(frozen=True)
class Groups:
    """``columns``: result columns that hold the group values; ``sources``: each source's columns
    holding the same values, in the same order; ``key``: result columns that identify a row
    (None: none do, as in a join of rows that only grow; the table then numbers a group's rows)."""

    columns: tuple[str, ...]
    sources: Mapping[str, tuple[str, ...]]
    key: tuple[str, ...] | None


def groups_of(tree: exp.Select, sources: tuple[str, ...], keys: Mapping[str, tuple[str, ...] | None]) -> Groups:
    """The groups of ``tree``, a query over the tables ``sources`` (whose keys are ``keys``)."""
    scope = _Scope({cte.alias: cte.this for cte in tree.find_all(exp.CTE)})
    selects = list(tree.find_all(exp.Select))
    for select in selects:
        scope.check_nesting(select)
    classes = _Classes()
    for select in selects:
        for left, right in scope.equalities(select):
            classes.join(left, right)
    for left, right in scope.unions(tree):
        classes.join(left, right)
    lists = [[classes.of(m) for m in found] for select in selects for found in scope.partitions(select)]
    if not lists:  # joins only: the columns they match on group the rows (a bid with its auction, by auction)
        lists = [[classes.of(a) for select in selects for a, _ in scope.equalities(select)]]
        if not lists[0]:
            raise NotGrouped("nothing in it groups the rows (no GROUP BY, PARTITION BY, DISTINCT or join)")
    shared = [c for c in dict.fromkeys(lists[0]) if all(c in other for other in lists[1:])]
    if not shared:
        raise NotGrouped("its GROUP BY / PARTITION BY / DISTINCT lists share no source column")
    for select in selects:  # keep the group columns every join matches on both sides
        for join, equal in scope.joins(select, classes):
            kept = [g for g in shared if g in equal]
            if not kept:
                raise NotGrouped(f"JOIN {join.this.sql(dialect=SPARK)[:60]} does not match "
                                 f"{_names(classes.members(shared[0]))} on both sides, so it could join rows of "
                                 "different groups")
            shared = kept
    found = {g: scope.find(tree, classes.members(g)) for g in shared}
    if not any(found.values()):
        raise NotGrouped(f"the result does not select {_names(classes.members(shared[0]))} as it is, so the rows "
                         "of a group could not be found in the table")
    shared = [g for g in shared if found[g]]  # (fewer group columns make larger groups: still groups)
    columns = [name for name in found.values() if name]
    by_source: dict[str, tuple[str, ...]] = {}
    for source in sources:
        held = [sorted(c for t, c in classes.members(g) if t == source) for g in shared]
        if [] in held:
            raise NotGrouped(f"{source} has no column equal to {_names(classes.members(shared[held.index([])]))}, "
                             "so its rows are not in groups")
        if any(len(h) > 1 for h in held):
            raise NotGrouped(f"{source} holds a group value in two columns ({', '.join(next(h for h in held if len(h) > 1))}"
                             "), so its rows of a group are not found by one")
        by_source[source] = tuple(h[0] for h in held)
    return Groups(tuple(columns), by_source, _key(tree, scope, sources, keys, shared, classes, columns))


def _names(members: set[Member]) -> str:
    return " = ".join(f"{t}.{c}" for t, c in sorted(members))


def _key(tree: exp.Select, scope: _Scope, sources: tuple[str, ...], keys: Mapping[str, tuple[str, ...] | None],
         shared: list[int], classes: _Classes, columns: list[str]) -> tuple[str, ...] | None:
    """Result columns that identify a row: the GROUP BY columns or the DISTINCT list of the
    outermost SELECT, else (no join above it) a ROW_NUMBER with its PARTITION BY columns, or
    (no join that repeats a row) the source's key; else None."""
    items = tree.expressions
    if tree.args.get("group"):
        group = {g.sql(dialect=SPARK) for g in tree.args["group"].expressions}
        names = [i.alias_or_name for i in items if i.unalias().sql(dialect=SPARK) in group or i.alias in group]
        return tuple(names) if len(names) == len(group) else None  # (a GROUP BY expression not selected)
    if tree.args.get("distinct"):  # (its items are named: a DISTINCT * would have held no group column)
        return tuple(i.alias_or_name for i in items)
    for window in tree.find_all(exp.Window):
        alias, home = window.parent, window.find_ancestor(exp.Select)
        if not isinstance(window.this, exp.RowNumber) or not isinstance(alias, exp.Alias) or home is None:
            continue
        above = [s for s in _enclosing(home) if s is not home]
        partition = {classes.of(m) for p in window.args.get("partition_by") or [] if isinstance(p, exp.Column)
                     for m in [scope.origin(home, p)] if m is not None}
        if not any(s.args.get("joins") for s in above) and partition <= set(shared) and scope.exposes(tree, alias.alias):
            return (*[columns[shared.index(g)] for g in shared if g in partition], alias.alias)
    if len(sources) == 1 and not any(scope.multiplies(s, keys) for s in tree.find_all(exp.Select)):
        key = keys.get(sources[0])
        names = [scope.find(tree, {(sources[0], k)}) for k in key or ()]
        if key and None not in names:
            return tuple(n for n in names if n is not None)
    return None


def _enclosing(select: exp.Expression) -> list[exp.Select]:
    """``select`` and the SELECTs it is nested in."""
    out: list[exp.Select] = []
    node: exp.Expression | None = select
    while node is not None:
        if isinstance(node, exp.Select):
            out.append(node)
        node = node.parent
    return out


class _Classes:
    """Source columns made equal by join conditions (union-find); a class is an int."""

    def __init__(self) -> None:
        self.parent: dict[Member, Member] = {}

    def _root(self, m: Member) -> Member:
        while self.parent.setdefault(m, m) != m:
            m = self.parent[m]
        return m

    def join(self, a: Member, b: Member) -> None:
        self.parent[self._root(a)] = self._root(b)

    def of(self, m: Member) -> int:
        return hash(self._root(m))

    def members(self, group: int) -> set[Member]:
        return {m for m in list(self.parent) if self.of(m) == group}


@dataclass(frozen=True)
class _Scope:
    """Which source column a column reference holds, through subqueries and CTEs."""

    ctes: dict[str, exp.Expression]

    def relations(self, select: exp.Select) -> dict[str, exp.Expression | str]:
        """alias -> a source table's name or the query behind it, for FROM and every JOIN."""
        items = [select.args["from_"].this] if select.args.get("from_") else []
        items += [j.this for j in select.args.get("joins") or []]
        out: dict[str, exp.Expression | str] = {}
        for item in items:
            if isinstance(item, exp.Table):
                out[item.alias_or_name] = self.ctes.get(item.name, item.name)
            elif isinstance(item, exp.Subquery):
                out[item.alias_or_name] = item.this  # a SELECT or a UNION
            else:
                raise NotGrouped(f"FROM {item.sql(dialect=SPARK)} is neither a table nor a subquery")
        return out

    def origin(self, select: exp.Select, column: exp.Column, aliases: bool = True) -> Member | None:
        """The source column ``column`` (in ``select``) holds unchanged, or the expression of one
        source's columns it holds (``computed``); None if it holds neither."""
        name = column.name
        computed = [i.unalias() for i in select.expressions if i.alias == name and not _plain(i.unalias(), name)]
        if aliases and not column.table and computed:  # an alias of a computed item (GROUP BY h, h = date_trunc(...))
            return self.computed(select, computed[0])
        relations = self.relations(select)
        if column.table:
            chosen = relations.get(column.table)
        elif len(relations) == 1:
            (chosen,) = relations.values()
        else:
            raise NotGrouped(f"column {name} in a join: qualify it with its table")
        if chosen is None:
            return None
        return (chosen, name) if isinstance(chosen, str) else self.output(chosen, name)

    def computed(self, select: exp.Select, node: exp.Expression) -> Member | None:
        """``node`` (in ``select``) as an expression of one source's columns, named by its SQL
        over them (``(bid, "WINDOW(date_time, '10 seconds')")``): a group value of that source's
        rows too. None if it aggregates, numbers rows, is random or reads several sources."""
        if isinstance(node, exp.Column):
            return self.origin(select, node, aliases=False)
        if node.find(exp.AggFunc, exp.Window, exp.Select, exp.Rand, exp.Star) or any(
                f.name.lower() in _RANDOM for f in node.find_all(exp.Anonymous)):
            return None
        found = [self.origin(select, c, aliases=False) for c in node.find_all(exp.Column)]
        held = [m for m in found if m is not None]
        sources = {t for t, _ in held}
        if not found or len(held) != len(found) or len(sources) != 1:
            return None
        copy = node.copy()
        for (_, name), column in zip(held, list(copy.find_all(exp.Column)), strict=True):
            column.replace(exp.column(name, quoted=not _SIMPLE.fullmatch(name)))
        return sources.pop(), copy.sql(dialect=SPARK)

    def output(self, body: exp.Expression, name: str) -> Member | None:
        """The source column (or ``computed`` expression) the query ``body`` outputs as ``name``
        (of a UNION: its first branch's, which ``unions`` makes equal to the other branches')."""
        if isinstance(body, exp.Union):
            return self.output(branches(body)[0], name)
        if not isinstance(body, exp.Select):
            return None
        for item in body.expressions:
            if not item.is_star and item.alias_or_name == name:
                return self.computed(body, item.unalias())
        for item in body.expressions:
            if item.is_star:
                table = item.unalias().table if isinstance(item.unalias(), exp.Column) else ""
                relations = {a: b for a, b in self.relations(body).items() if not table or a == table}
                if len(relations) == 1:
                    (relation,) = relations.values()
                    return (relation, name) if isinstance(relation, str) else self.output(relation, name)
        return None

    def find(self, body: exp.Expression, members: set[Member]) -> str | None:
        """The name under which ``body`` outputs one of ``members`` unchanged, if it does."""
        if not isinstance(body, exp.Select):
            return None
        for item in body.expressions:
            if not item.is_star and self.computed(body, item.unalias()) in members:
                return item.alias_or_name
        for item in body.expressions:
            if item.is_star:
                table = item.unalias().table if isinstance(item.unalias(), exp.Column) else ""
                for alias, relation in self.relations(body).items():
                    if table and alias != table:
                        continue
                    if isinstance(relation, str):
                        hit = next((c for t, c in sorted(members) if t == relation), None)
                    else:
                        hit = self.find(relation, members)
                    if hit is not None:
                        return hit
        return None

    def exposes(self, body: exp.Expression | str, name: str) -> bool:
        """Does ``body`` output a column called ``name`` (whatever it computes)?"""
        if not isinstance(body, exp.Select):
            return isinstance(body, str)
        if any(i.alias_or_name == name and not i.is_star for i in body.expressions):
            return True
        return any(i.is_star and any(self.exposes(b, name) for b in self.relations(body).values())
                   for i in body.expressions)

    def partitions(self, select: exp.Select) -> list[list[Member]]:
        """The source columns each GROUP BY, DISTINCT and window PARTITION BY of ``select`` holds."""
        out: list[list[Member]] = []

        def held(columns: list[exp.Expression]) -> list[Member]:
            found = [self.origin(select, c) if isinstance(c, exp.Column) else self.computed(select, c)
                     for c in columns if not c.is_star]
            return [m for m in found if m is not None]

        if select.args.get("group"):
            out.append(held(select.args["group"].expressions))
        elif any(not a.find_ancestor(exp.Window) for i in select.expressions for a in i.find_all(exp.AggFunc)):
            raise NotGrouped(f"{select.sql(dialect=SPARK)[:80]} aggregates all its rows into one (no GROUP BY)")
        if select.args.get("distinct"):
            out.append(held([i.unalias() for i in select.expressions]))
        for window in select.find_all(exp.Window):
            if window.find_ancestor(exp.Select) is not select:
                continue
            partition = window.args.get("partition_by") or []
            if not partition:
                raise NotGrouped(f"window function {window.sql(dialect=SPARK)} has no PARTITION BY: every row "
                                 "depends on all others")
            out.append(held(partition))
        return out

    def equalities(self, select: exp.Select) -> list[tuple[Member, Member]]:
        """Pairs of source columns the joins of ``select`` make equal (``ON a.x = b.y``, USING)."""
        return [pair for join in select.args.get("joins") or [] for pair in self._equal(select, join)]

    def joins(self, select: exp.Select, classes: _Classes) -> list[tuple[exp.Join, set[int]]]:
        """Each join of ``select`` with the group columns its condition equates on both sides."""
        return [(join, {classes.of(a) for a, b in self._equal(select, join) if classes.of(a) == classes.of(b)})
                for join in select.args.get("joins") or []]

    def _equal(self, select: exp.Select, join: exp.Join) -> list[tuple[Member, Member]]:
        """The source columns one join's condition makes equal, in pairs."""
        pairs: list[tuple[Member, Member]] = []
        for c in conjuncts(join.args.get("on")):
            if isinstance(c, exp.EQ):
                left, right = self.computed(select, c.this), self.computed(select, c.expression)
                if left is not None and right is not None:
                    pairs.append((left, right))
        for ident in join.args.get("using") or []:
            sides = [self.origin(select, exp.column(ident.name, table=a)) for a in self.relations(select)]
            found = [m for m in sides if m is not None]
            pairs += list(zip(found, found[1:], strict=False))
        return pairs

    def multiplies(self, select: exp.Select, keys: Mapping[str, tuple[str, ...] | None]) -> bool:
        """Can a join of ``select`` match a row of its FROM relation more than once? Not when each
        joined relation is unique on the columns its condition equates: a GROUP BY subquery on
        its group columns, a source table on its key."""
        for join in select.args.get("joins") or []:
            alias, relation = join.this.alias_or_name, self.relations(select).get(join.this.alias_or_name)
            on = join.args.get("on")
            equated = {c.name for eq in conjuncts(on)
                       if isinstance(eq, exp.EQ) for c in (eq.this, eq.expression)
                       if isinstance(c, exp.Column) and c.table == alias}
            if isinstance(relation, str):
                unique = set(keys.get(relation) or ["\0"])
            elif isinstance(relation, exp.Select) and relation.args.get("group"):
                group = {g.sql(dialect=SPARK) for g in relation.args["group"].expressions}
                unique = {i.alias_or_name for i in relation.expressions if i.unalias().sql(dialect=SPARK) in group}
                unique = unique if len(unique) == len(group) else {"\0"}
            else:
                return True
            if not unique <= equated:
                return True
        return False

    def unions(self, tree: exp.Expression) -> list[tuple[Member, Member]]:
        """Pairs of source columns a UNION in ``tree`` outputs at the same position: its rows of
        a group hold the group value in either."""
        pairs: list[tuple[Member, Member]] = []
        for union in tree.find_all(exp.Union):
            if isinstance(union.parent, exp.Union):
                continue  # (counted with the UNION it is a branch of)
            selects = branches(union)
            for position in range(min((len(b.expressions) for b in selects), default=0)):
                held = [self.computed(b, b.expressions[position].unalias()) for b in selects]
                found = [m for m in held if m is not None]
                pairs += list(zip(found, found[1:], strict=False)) if len(found) == len(held) else []
        return pairs

    def check_nesting(self, select: exp.Select) -> None:
        """A subquery may stand in FROM, JOIN or WITH only (not in WHERE or the select list),
        alone or as a branch of a UNION there."""
        parent = select.parent
        while isinstance(parent, exp.Union):
            parent = parent.parent
        if parent is None or isinstance(parent, exp.CTE):
            return
        if isinstance(parent, exp.Subquery) and isinstance(parent.parent, exp.From | exp.Join):
            return
        raise NotGrouped(f"subquery {select.sql(dialect=SPARK)[:60]} stands outside FROM/JOIN/WITH")


def branches(union: exp.Union) -> list[exp.Select]:
    """The SELECTs a UNION (of UNIONs) combines, in order."""
    sides = [s.this if isinstance(s, exp.Subquery) else s for s in (union.this, union.expression)]
    return [s for side in sides for s in (branches(side) if isinstance(side, exp.Union) else [side])
            if isinstance(s, exp.Select)]


def conjuncts(on: exp.Expression | None) -> list[exp.Expression]:
    """The ANDed conditions of a join's ON (none without one)."""
    return list(on.flatten()) if isinstance(on, exp.And) else [on] if on is not None else []


def _plain(node: exp.Expression, name: str) -> bool:
    return isinstance(node, exp.Column) and node.name == name and not node.is_star


@dataclass(frozen=True)
class GroupValue:
    """How a source's rows hold one group value (``Groups.sources``): a column, or an
    expression of its columns; a time ``window(time, ...)`` holds the rows whose time falls
    in it (in several windows when they slide)."""

    expression: str  # Spark SQL over the source's columns
    column: str | None = None  # the plain column, if it is one
    time: str | None = None  # a window's time expression


def group_value(text: str) -> GroupValue:
    """What a ``Groups.sources`` entry is.

    >>> group_value("auction")
    GroupValue(expression='auction', column='auction', time=None)
    >>> group_value("WINDOW(date_time, '10 seconds')").time
    'date_time'
    """
    if _SIMPLE.fullmatch(text):
        return GroupValue(text, text)
    try:
        node = sqlglot.parse_one(text, read=SPARK)
    except sqlglot.errors.ParseError:
        node = None
    if node is None or isinstance(node, exp.Alias):  # a column whose name is not an identifier ("my col")
        return GroupValue(f"`{text}`", text)
    if isinstance(node, exp.Column):
        return GroupValue(text, node.name)
    if isinstance(node, exp.Anonymous) and node.name.lower() == "window" and node.expressions:
        return GroupValue(text, time=node.expressions[0].sql(dialect=SPARK))
    return GroupValue(text)
