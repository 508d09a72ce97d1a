"""Skipping the files a barrier's change cannot touch.

A barrier usually changes few keys. Read as data (a join, a semi-join), those keys make Spark
open every file of the table they are looked up in: nothing in a plan tells Delta which files
may hold them. Collected to the driver instead (when there are few), they become static filters
(each column's value range, and the values themselves when there are a handful), which Delta's
data skipping matches against every file's min/max statistics and Parquet against its row groups'.
Where a table's layout keeps near keys together (rows written in key or time order, as a stream
writes them), a read of the rows of the changed keys, or a MERGE of them, opens only the files
that can hold them, and its cost follows the change instead of the table. The filters only
narrow what is read: the semi-join or the MERGE condition beside them stays the exact test.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import NamedTuple

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

KEYS_LIMIT = 10_000  # more changed keys than this are joined as data, unfiltered
LISTED_LIMIT = 64  # up to this many values are also matched one by one (an IN list), not only as a range
_ORDERED = (int, str, Decimal, date, datetime)  # compared by Python as Spark compares them (not float: NaN)


def few_keys(keys: DataFrame, limit: int = KEYS_LIMIT) -> tuple[DataFrame, list[Row]] | None:
    """``keys`` (distinct rows) collected when there are at most ``limit``: the rows, and a local
    DataFrame of them that later joins read without computing ``keys`` again; None if more.

    Example::

        found = few_keys(changed.select("g").distinct())
        if found is not None:
            local, rows = found
            snapshot = snapshot.where(within(rows, [("g", "g")]))
    """
    rows = keys.limit(limit + 1).collect()
    if len(rows) > limit:
        return None
    return keys.sparkSession.createDataFrame(rows, keys.schema), rows


def within(rows: Sequence[Row], pairs: Sequence[tuple[str, str]]) -> Column:
    """True for every row whose column ``c`` equals field ``n`` of one of ``rows`` for each
    ``(c, n)`` in ``pairs`` (and for more: it is a filter for skipping, not the exact test).
    ``c`` may be qualified (``t.g``) as in a MERGE condition."""
    return functools.reduce(lambda a, b: a & b, [_one(F.col(column), bounds([r[field] for r in rows]))
                                                 for column, field in pairs])


class Bounds(NamedTuple):
    low: object
    high: object
    listed: tuple[object, ...]  # the values themselves, when few; else ()
    nulls: bool


def bounds(values: Sequence[object]) -> Bounds | None:
    """What a filter on one column can say of ``values``; None where Python cannot order them
    as Spark does (floats, with NaN; bytes; structs) or there is no value at all.

    >>> bounds([3, None, 1, 3])
    Bounds(low=1, high=3, listed=(1, 3), nulls=True)
    >>> bounds([0.5]) is None, bounds([None])
    (True, Bounds(low=None, high=None, listed=(), nulls=True))
    """
    present = {v for v in values if v is not None}
    if not all(isinstance(v, _ORDERED) and not isinstance(v, bool) for v in present):
        return None
    nulls = len(present) < len(set(values))
    if not present:
        return Bounds(None, None, (), True) if nulls else None
    ordered = sorted(present)  # type: ignore[type-var]
    return Bounds(ordered[0], ordered[-1], tuple(ordered) if len(ordered) <= LISTED_LIMIT else (), nulls)


def _one(column: Column, found: Bounds | None) -> Column:
    if found is None:
        return F.lit(True)
    test = column.isNull() if found.low is None else column.between(found.low, found.high)
    if found.listed:
        test = test & column.isin(list(found.listed))
    return test | column.isNull() if found.nulls and found.low is not None else test
