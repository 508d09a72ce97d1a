"""The transaction alignment rule over every interleaving hypothesis finds: each table applies
it alone, and together they never split a source transaction."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain.source_transactions import Aligned, Change, TransactionEnded, aligned

TABLES = ("public.debits", "public.credits")


def test_a_table_stops_at_the_first_transaction_that_has_not_ended() -> None:
    ended = {7: TransactionEnded(7, {"public.orders": 2, "public.lines": 1})}
    changes = [Change(0, None), Change(1, None), Change(2, 7), Change(3, 7, tombstone=True), Change(4, 7), Change(5, 8)]
    assert aligned(0, changes, ended, "public.orders") == Aligned(end=5)  # snapshot, then all of 7 (and its tombstone)
    assert aligned(0, changes[:3], ended, "public.orders") == Aligned(end=3, missing={7: 1})
    assert aligned(4, [], ended, "public.lines") == Aligned(end=4, missing={7: 1})  # none of its events here yet
    assert aligned(9, [Change(9, 8)], ended, "public.orders") == Aligned(end=9, missing={7: 2})


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[dict[str, int]], int, dict[str, int]]:
    """Transactions in commit order (events per table), how many have their END below the cut,
    and how many of each table's records are visible (a table's topic may lag the markers)."""
    transactions = draw(st.lists(st.fixed_dictionaries({t: st.integers(0, 3) for t in TABLES}), min_size=1, max_size=12))
    transactions = [t for t in transactions if any(t.values())] or [{TABLES[0]: 1, TABLES[1]: 1}]
    cut = draw(st.integers(0, len(transactions)))
    visible = {table: draw(st.integers(0, sum(t[table] for t in transactions))) for table in TABLES}
    return transactions, cut, visible


@settings(max_examples=400, deadline=None)
@given(histories())
def test_tables_aligned_alone_hold_the_same_transactions(history: tuple[list[dict[str, int]], int, dict[str, int]]) -> None:
    transactions, cut, visible = history
    ended = {tx: TransactionEnded(tx, {t: n for t, n in events.items() if n}) for tx, events in enumerate(transactions[:cut])}
    held: dict[str, set[int]] = {}
    for table in TABLES:
        records = [Change(offset, tx) for offset, tx in enumerate(
            tx for tx, events in enumerate(transactions) for _ in range(events[table]))]
        shown = records[: visible[table]]
        result = aligned(0, shown, ended, table)
        complete = aligned(0, records, ended, table)  # once every record arrived
        assert complete.missing == {}
        assert {c.tx_id for c in records[: complete.end]} == {tx for tx in ended if transactions[tx][table]}
        if not result.missing:  # nothing to wait for: what it holds is final
            assert result.end == complete.end
        held[table] = {c.tx_id for c in records[: complete.end] if c.tx_id is not None}
    for tx in range(len(transactions)):  # a transaction is in every table it touched, or in none
        touched = [table for table in TABLES if transactions[tx][table]]
        assert len({tx in held[table] for table in touched}) <= 1
