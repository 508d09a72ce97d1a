"""The Spark SQL dialect Lockstep parses and writes queries in: sqlglot's Spark dialect, plus
Spark's ``window(ts, ...)`` as a GROUP BY expression (sqlglot stops a GROUP BY at the word
WINDOW, taking it for a named-window clause, so ``GROUP BY window(ts, '10 seconds')`` failed).
Every module that parses a query passes ``SPARK`` as sqlglot's ``read=``/``dialect=``.

Example::

    >>> import sqlglot
    >>> sqlglot.parse_one("SELECT COUNT(*) AS n FROM bids GROUP BY window(ts, '10 seconds')", read=SPARK).sql(SPARK)
    "SELECT COUNT(*) AS n FROM bids GROUP BY WINDOW(ts, '10 seconds')"
"""

from __future__ import annotations

from sqlglot import TokenType
from sqlglot.dialects.spark import Spark


class LockstepSpark(Spark):
    """Spark SQL as Lockstep reads it (see the module docstring)."""

    class Parser(Spark.Parser):  # type: ignore[misc,valid-type]
        # the tokens a GROUP BY list stops at before its first expression: WINDOW starts an
        # expression there (`window(...)`), a named-window clause cannot follow GROUP BY at once
        QUERY_MODIFIER_TOKENS = Spark.Parser.QUERY_MODIFIER_TOKENS - {TokenType.WINDOW}


SPARK = LockstepSpark
