"""Which of a table's change events belong to a barrier when the source's transactions must not
be split across the tables of one database: the rule transaction-aligned ingestion of Debezium
sources stands on (root option ``'transactions'``, ``spark_jobs.runtime.source_transactions``).

Debezium writes each source transaction's events to one topic per table, and a BEGIN and an END
marker to ``<prefix>.transaction``; END counts the transaction's events per table. A barrier
cuts the transaction topic like any other. The rule: barrier ``b`` holds exactly the
transactions whose END lies below its cut of the transaction topic, in every table of the
source. Each job applies it alone, and since the rule depends only on what the topics hold, no
table sees half of a transaction that another table sees whole.

Per partition, Debezium writes transactions in commit order, so a barrier's events are a prefix
of what the table has not applied yet. A scan of the partition from where the last barrier
ended to its data cut finds the first record of a transaction that has not ended
(``first_open``): the barrier ends there. An ended transaction whose END reached the transaction
topic before all its events reached this table's topic is ``missing`` events: the job reads
past its data cut until they are in and the barrier ends after the last of them, so it holds
the whole transaction, as every other table does (records outside any transaction, a snapshot's,
that lie before them come with them).

Example::

    >>> ended = {"7": TransactionEnded("7", {"public.orders": 2})}
    >>> aligned([PartitionScan(0, first_open=12, last_ended=11, end=20)], [], {"7": 2}, ended, "public.orders")
    Aligned(ends={0: 12}, missing={})
    >>> aligned([PartitionScan(0, None, 10, end=11)], [], {"7": 1}, ended, "public.orders")  # read on past 11
    Aligned(ends={0: 11}, missing={'7': 1})
    >>> aligned([PartitionScan(0, None, 10, end=11)], [PartitionScan(0, 14, 13, end=15)], {"7": 2}, ended, "public.orders")
    Aligned(ends={0: 14}, missing={})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TransactionEnded:
    """An END marker: the source transaction ``tx_id`` and its event count per table (``schema.table``)."""

    tx_id: str
    counts: Mapping[str, int]


@dataclass(frozen=True)
class PartitionScan:
    """What a scan of one partition's range found: its first record of a transaction that has
    not ended, its last record of one that has (None: no such record), and where it ended
    (exclusive)."""

    partition: int
    first_open: int | None
    last_ended: int | None
    end: int


@dataclass(frozen=True)
class Aligned:
    """Where this barrier's events end per partition (exclusive offset), and the ended
    transactions whose events are not all there yet (tx id -> events still to come)."""

    ends: dict[int, int]
    missing: dict[str, int] = field(default_factory=dict)


def aligned(below_cut: Sequence[PartitionScan], past_cut: Sequence[PartitionScan], seen: Mapping[str, int],
            ended: Mapping[str, TransactionEnded], collection: str) -> Aligned:
    """A partition ends at its first open record below the data cut, else at the cut, or past
    it (``past_cut``: scanned only while events are ``missing``) after its last record of an
    ended transaction there. ``seen`` counts the events of the ended transactions both scans
    found (tombstones not counted: END does not count them)."""
    past = {scan.partition: scan for scan in past_cut}
    ends: dict[int, int] = {}
    for scan in below_cut:
        if scan.first_open is not None:
            ends[scan.partition] = scan.first_open
        elif (further := past.get(scan.partition)) is not None and further.last_ended is not None:
            ends[scan.partition] = max(scan.end, further.last_ended + 1)
        else:
            ends[scan.partition] = scan.end
    missing = {tx: count - seen.get(tx, 0) for tx, marker in ended.items()
               if (count := marker.counts.get(collection, 0)) > seen.get(tx, 0)}
    return Aligned(ends, missing)
