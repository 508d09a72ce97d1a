"""The transaction alignment rule over every interleaving hypothesis finds: each table applies
it alone, barrier after barrier, and together they never split a source transaction."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain.source_transactions import Aligned, PartitionScan, TransactionEnded, aligned

TABLES = ("public.debits", "public.credits")
Record = tuple[str | None, bool]  # (transaction, tombstone)


def scan(records: list[Record], start: int, stop: int, ended: set[str]) -> tuple[PartitionScan, Counter[str]]:
    """What the job's scan query finds in ``[start, stop)`` of partition 0 (the same definitions)."""
    first_open = last_ended = None
    seen: Counter[str] = Counter()
    for offset in range(start, stop):
        tx, tombstone = records[offset]
        if tx is not None and tx not in ended and first_open is None:
            first_open = offset
        if tx in ended:
            last_ended = offset
            seen[tx] += not tombstone
    return PartitionScan(0, first_open, last_ended, max(start, stop)), seen


def test_a_table_stops_at_the_first_transaction_that_has_not_ended() -> None:
    ended = {"7": TransactionEnded("7", {"public.orders": 2, "public.lines": 1})}
    records: list[Record] = [(None, False), (None, False), ("7", False), ("7", True), ("7", False), ("8", False)]
    below, seen = scan(records, 0, 6, set(ended))
    assert aligned([below], [], seen, ended, "public.orders") == Aligned({0: 5})  # snapshot, all of 7 and its tombstone
    below, seen = scan(records, 0, 3, set(ended))
    assert aligned([below], [], seen, ended, "public.orders") == Aligned({0: 3}, {"7": 1})
    past, more = scan(records, 3, 6, set(ended))
    assert aligned([below], [past], seen + more, ended, "public.orders") == Aligned({0: 5})  # read on to its last event
    nothing = PartitionScan(0, None, None, 4)
    assert aligned([nothing], [], {}, ended, "public.lines") == Aligned({0: 4}, {"7": 1})  # none of its events here yet


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[dict[str, int]], dict[str, int], list[tuple[int, dict[str, float]]]]:
    """Transactions in commit order (events per table), each table's snapshot (records outside
    any transaction, before them), and barriers: how many transactions have their END below
    the barrier's cut, and how far each table's topic had got (a topic may lag the markers)."""
    transactions = draw(st.lists(st.fixed_dictionaries({t: st.integers(0, 3) for t in TABLES}), min_size=1, max_size=10))
    snapshot = {t: draw(st.integers(0, 3)) for t in TABLES}
    cuts = sorted(draw(st.lists(st.integers(0, len(transactions)), min_size=1, max_size=5)))
    barriers = [(cut, {t: draw(st.floats(0, 1)) for t in TABLES}) for cut in cuts]
    return transactions, snapshot, barriers


@settings(max_examples=400)
@given(histories())
def test_tables_aligned_alone_hold_the_same_whole_transactions_at_every_barrier(history: tuple) -> None:
    transactions, snapshot, barriers = history
    topics: dict[str, list[Record]] = {
        table: [(None, False)] * snapshot[table]
        + [(str(tx), False) for tx, events in enumerate(transactions) for _ in range(events[table])] for table in TABLES}
    where = dict.fromkeys(TABLES, 0)  # where each table's last barrier ended
    visible = dict.fromkeys(TABLES, 0)
    before = 0  # the transaction topic's cut of the barrier before: a barrier reads the ENDs after it
    for cut, progress in barriers:
        ended = {str(tx): TransactionEnded(str(tx), {t: n for t, n in transactions[tx].items() if n})
                 for tx in range(before, cut)}
        before = cut
        held = {}
        for table, records in topics.items():
            # the data cut: how far the topic had got (never back), at least to where the table stands
            visible[table] = max(visible[table], round(progress[table] * len(records)))
            data_cut = max(visible[table], where[table])
            below, seen = scan(records, where[table], data_cut, set(ended))
            result = aligned([below], [], seen, ended, table)
            if result.missing:  # read on past the cut once the rest arrived
                past, more = scan(records, data_cut, len(records), set(ended))
                result = aligned([below], [past], seen + more, ended, table)
            assert result.missing == {}
            where[table] = result.ends[0]
            held[table] = Counter(tx for tx, _ in records[: where[table]] if tx is not None)
        for tx, events in enumerate(transactions):  # whole transactions, the ended ones, in every table
            for table in TABLES:
                expected = events[table] if tx < cut else 0
                assert held[table][str(tx)] == expected, (tx, table, held, cut)
