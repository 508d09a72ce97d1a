"""Which of a table's change events belong to a barrier when the source's transactions must not
be split: the rule the transaction-aligned ingestion of Debezium sources stands on (the jobs do
not use it yet: issue 30's next slice wires it in).

Debezium writes each source transaction's events to one topic per table, and a BEGIN and an END
marker to ``<prefix>.transaction``; END counts the transaction's events per table. A barrier
cuts the transaction topic like any other. The rule: barrier ``b`` holds exactly the
transactions whose END lies below its cut of the transaction topic, in every table of the
source; since each job can apply it alone, no table sees half of a transaction that another
table sees whole. Per table, Debezium writes transactions in commit order, so the events a
barrier holds are a prefix of what the job has not applied yet: ``aligned`` finds where that
prefix ends, and which ended transactions still miss events (their END reached the
transaction topic before all their events reached this table's topic: read on until they are in).

Example::

    >>> ended = {7: TransactionEnded(7, {"public.orders": 2})}
    >>> aligned(10, [Change(10, 7), Change(11, 7), Change(12, 8)], ended, "public.orders")
    Aligned(end=12, missing={})
    >>> aligned(10, [Change(10, 7)], ended, "public.orders")
    Aligned(end=11, missing={7: 1})
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TransactionEnded:
    """An END marker: the source transaction ``tx_id`` and its event count per table."""

    tx_id: int
    counts: Mapping[str, int]


@dataclass(frozen=True)
class Change:
    """A record of a table's topic as the alignment sees it: its offset and transaction (None:
    outside any transaction, as a snapshot's records are); a tombstone belongs to the delete
    before it and is not counted (END does not count tombstones)."""

    offset: int
    tx_id: int | None
    tombstone: bool = False


@dataclass(frozen=True)
class Aligned:
    """Where this barrier's events of a table end (exclusive offset), and the ended transactions
    whose events are not all there yet (tx id -> events still to come)."""

    end: int
    missing: dict[int, int] = field(default_factory=dict)


def aligned(start: int, changes: Sequence[Change], ended: Mapping[int, TransactionEnded], collection: str) -> Aligned:
    """The prefix of ``changes`` (a table's records from ``start``, where its last barrier ended, in
    offset order) that the barrier holds: records outside transactions, and records of transactions in
    ``ended`` (the END markers in this barrier's range of the transaction topic), up to the first
    record of a transaction that has not ended. An ended transaction with fewer of this table's
    events than its END counts is ``missing``: they are still on their way (a topic's records
    keep commit order, so they can only come after everything here)."""
    seen: Counter[int] = Counter()
    end = start
    current: int | None = None  # the transaction of the record before (a tombstone's)
    for change in changes:
        tx = current if change.tombstone else change.tx_id
        if tx is not None and tx not in ended:
            break
        if tx is not None and not change.tombstone:
            seen[tx] += 1
        current, end = tx, change.offset + 1
    missing = {tx: count - seen[tx] for tx, marker in ended.items() if (count := marker.counts.get(collection, 0)) > seen[tx]}
    return Aligned(end=end, missing=missing)
