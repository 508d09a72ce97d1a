"""Where a new root table starts reading its topics: one rule per table, ``WITH ('start' = ...)``,
as Flink's ``scan.startup.mode`` and Spark's ``startingOffsets``:

* ``earliest`` (the default): every record its topics hold when the table is declared, and every
  one after: what a user who sends data first and starts the pipeline second expects;
* ``latest``: only the records written after the table is declared (each partition's end then,
  as a read_committed reader sees it);
* ``timestamp:<ms>``: in each partition, from the first record whose timestamp is at or after
  ``<ms>`` (epoch milliseconds); a partition with no record that late starts at its end.

The runner that declares the table resolves its rule to offsets (``coordinator.client.starts``),
and the coordinator keeps them with the table (``TableState.start_offsets``), so a restart, a
revision from scratch and a failover all start from the same offsets. A partition the rule did
not resolve (its topic did not exist yet, or gained partitions later) starts at its first record.

>>> start_problem("latest"), start_problem("timestamp:1765000000000")
(None, None)
>>> start_problem("newest")
"'start' = 'newest' is not a start rule: use 'earliest' (the default), 'latest' or 'timestamp:<epoch ms>'"
>>> describe("latest", (CutEntry("orders", 1, 7), CutEntry("orders", 0, 12)))
'latest: orders[0] from offset 12, orders[1] from offset 7'
"""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.domain.events import CutEntry, OffsetRange, TableState
from coordinator.domain.validity import MAX_NUMBER

EARLIEST = "earliest"
LATEST = "latest"
TIMESTAMP = "timestamp:"
EARLIEST_OFFSET = -2  # an offset range's start that reads a partition from its first record (Kafka's -2)


def start_problem(rule: str) -> str | None:
    """Why ``rule`` is not a start rule, or None."""
    if rule in (EARLIEST, LATEST) or (rule.startswith(TIMESTAMP) and _timestamp(rule) is not None):
        return None
    return (f"'start' = {rule!r} is not a start rule: use 'earliest' (the default), 'latest' or "
            "'timestamp:<epoch ms>'")


def _timestamp(rule: str) -> int | None:
    digits = rule[len(TIMESTAMP):]
    return int(digits) if digits.isdigit() and int(digits) <= MAX_NUMBER else None


def timestamp_of(rule: str) -> int | None:
    """The epoch milliseconds of a ``timestamp:<ms>`` rule, else None.

    >>> timestamp_of("timestamp:1765000000000"), timestamp_of("latest")
    (1765000000000, None)
    """
    return _timestamp(rule) if rule.startswith(TIMESTAMP) else None


def meaning(rule: str) -> str:
    """Where ``rule`` starts a new table, in words (``lockstep explain``).

    >>> meaning("timestamp:1765000000000")
    "each partition at its first record stamped at or after 1765000000000 ms ('start' = 'timestamp:1765000000000')"
    """
    if rule == LATEST:
        return "each partition at its end when the table is declared ('start' = 'latest')"
    if (ts_ms := timestamp_of(rule)) is not None:
        return f"each partition at its first record stamped at or after {ts_ms} ms ('start' = '{rule}')"
    return "each partition at its first record ('start' = 'earliest', the default)"


def rule_of(table: TableState) -> str:
    """The table's start rule; a table declared before tables had one started from the earliest."""
    return table.start or EARLIEST


def begin_offsets(table: TableState) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the offset the table's first barrier reads each partition from."""
    return {(c.topic, c.partition): c.offset for c in table.start_offsets}


def departures(ranges: Iterable[OffsetRange], begin: dict[tuple[str, int], int]) -> list[str]:
    """How a table's first barrier's ``ranges`` depart from where its start rule resolved to
    (``begin_offsets``), one line per partition; none when they begin there.

    >>> departures([OffsetRange("t", 0, 40, 90), OffsetRange("t", 1, 7, 9)], {("t", 0): 25, ("t", 1): 7})
    ['t[0] is read from offset 40, not 25: records 25 to 39 are not in the table']
    >>> departures([OffsetRange("t", 0, 3, 9)], {})
    ['t[0] is read from offset 3, not its first record: records before offset 3 are not in the table']
    """
    out = []
    for r in ranges:
        expected = begin.get((r.topic, r.partition), EARLIEST_OFFSET)
        if r.start == expected:
            continue
        if expected == EARLIEST_OFFSET:
            out.append(f"{r.topic}[{r.partition}] is read from offset {r.start}, not its first record: records "
                       f"before offset {r.start} are not in the table")
        elif r.start > expected:
            out.append(f"{r.topic}[{r.partition}] is read from offset {r.start}, not {expected}: records {expected} to "
                       f"{r.start - 1} are not in the table")
        else:
            out.append(f"{r.topic}[{r.partition}] is read from offset {r.start}, not {expected}: records before "
                       f"offset {expected} are read too")
    return out


def describe(rule: str, offsets: Iterable[CutEntry]) -> str:
    """The rule and the offsets it resolved to, for people (``lockstep status``, ``explain``)."""
    resolved = sorted(offsets, key=lambda c: (c.topic, c.partition))
    if not resolved:
        return f"{rule or EARLIEST}: every partition from its first record"
    return f"{rule or EARLIEST}: " + ", ".join(f"{c.topic}[{c.partition}] from offset {c.offset}" for c in resolved)
