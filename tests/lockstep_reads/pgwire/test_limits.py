"""The serve limits' values in PostgreSQL's and Materialize's forms (pure)."""

from __future__ import annotations

import pytest

from lockstep_reads.pgwire.limits import LimitError, Limits, check, duration_ms, size_bytes


@pytest.mark.parametrize(("value", "ms"), [("250", 250), ("5s", 5000), ("2min", 120_000), ("1.5h", 5_400_000),
                                           ("0", 0), (" 10 ms ", 10)])
def test_durations_take_postgres_units_and_plain_numbers_are_milliseconds(value: str, ms: int) -> None:
    assert duration_ms("statement_timeout", value) == ms


@pytest.mark.parametrize(("value", "size"), [("1048576", 1 << 20), ("100MB", 100 << 20), ("1gb", 1 << 30), ("0", 0)])
def test_sizes_take_materialize_units_and_plain_numbers_are_bytes(value: str, size: int) -> None:
    assert size_bytes("max_result_size", value) == size


@pytest.mark.parametrize(("name", "value"), [("statement_timeout", "5x"), ("statement_timeout", "-1"),
                                             ("max_result_size", "1 GiB"), ("idle_in_transaction_session_timeout", "")])
def test_a_value_a_limit_cannot_take_says_which_forms_it_takes(name: str, value: str) -> None:
    with pytest.raises(LimitError, match=f'invalid value for parameter "{name}": "{value}" \\(a number'):
        check(name, value)


def test_a_new_session_shows_the_server_s_limits() -> None:
    assert Limits(statement_timeout_ms=5000).defaults()["statement_timeout"] == "5000ms"
    assert check("max_result_size", Limits().defaults()["max_result_size"]) == f"{1 << 30}B"
