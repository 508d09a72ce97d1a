"""The SQL dialect: Spark's, plus ``window(...)`` as a GROUP BY expression."""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

from coordinator.spark_sql import SPARK


@pytest.mark.parametrize("group", ["window(ts, '10 seconds')", "auction, window(ts, '1 minute', '10 seconds')",
                                   "window(ts, '10 seconds'), auction"])
def test_group_by_window_parses_as_a_function(group: str) -> None:
    tree = sqlglot.parse_one(f"SELECT COUNT(*) AS n FROM bids GROUP BY {group}", read=SPARK)
    assert tree.args["group"].sql(dialect=SPARK).upper() == f"GROUP BY {group}".upper()
    assert not tree.args.get("windows")
    if group.startswith("window"):  # the plain Spark dialect stops the GROUP BY at the word WINDOW
        with pytest.raises(sqlglot.errors.ParseError):
            sqlglot.parse_one(f"SELECT COUNT(*) AS n FROM bids GROUP BY {group}", read="spark")


def test_a_named_window_clause_still_parses() -> None:
    tree = sqlglot.parse_one("SELECT a, COUNT(*) OVER w FROM t GROUP BY a WINDOW w AS (PARTITION BY a)", read=SPARK)
    assert isinstance(tree.args["windows"][0], exp.Window)
