"""Query worker processes: a statement past its deadline or cancelled is stopped by killing its
process, which is replaced; errors come back as the reader's error types; rows come a batch at
a time (real processes, real DataFusion; no server)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from coordinator.settings import Settings
from lockstep_reads.pgwire.workers import Job, QueryWorkers, Stopped
from lockstep_reads.statements import QueryError

RUNAWAY = "SELECT count(*) FROM generate_series(1, 100000000000)"


@pytest.fixture(scope="module")
def workers() -> Iterator[QueryWorkers]:
    pool = QueryWorkers(Settings(), count=2)
    yield pool
    pool.close()


def rows_of(workers: QueryWorkers, sql: str, seconds: float = 30, stopped: str | None = None) -> list[int]:
    deadline = time.monotonic() + seconds
    with workers.running(workers.take(deadline, lambda: stopped), Job(sql, {}), deadline, lambda: stopped) as rows:
        rows.start()
        return [row for batch in iter(rows.next, None) for row in batch.column(0).to_pylist()]


def test_rows_come_a_batch_at_a_time_and_a_worker_serves_query_after_query(workers: QueryWorkers) -> None:
    assert rows_of(workers, "SELECT * FROM generate_series(1, 20000)") == list(range(1, 20001))
    deadline = time.monotonic() + 30
    with workers.running(workers.take(deadline, lambda: None), Job("SELECT * FROM generate_series(1, 100000)", {}),
                         deadline, lambda: None) as rows:
        rows.start()
        first = rows.next()
        assert first is not None and 0 < first.num_rows < 100_000  # the rest is not computed yet
    assert rows_of(workers, "SELECT 41 + 1") == [42]  # the worker left early was replaced


def test_a_runaway_query_is_stopped_at_its_deadline_or_cancel_and_its_worker_replaced(workers: QueryWorkers) -> None:
    began = time.monotonic()
    with pytest.raises(Stopped) as timed_out:
        rows_of(workers, RUNAWAY, seconds=1)
    assert timed_out.value.why == "timeout" and time.monotonic() - began < 3
    with pytest.raises(Stopped) as cancelled:
        rows_of(workers, RUNAWAY, stopped="cancel")
    assert cancelled.value.why == "cancel"
    for _ in range(3):  # more queries than workers: the killed ones were replaced
        assert rows_of(workers, "SELECT 7") == [7]


def test_a_query_s_error_comes_back_as_the_reader_s_error_and_the_worker_lives_on(workers: QueryWorkers) -> None:
    with pytest.raises(QueryError, match="No field named nope"):
        rows_of(workers, "SELECT nope FROM generate_series(1, 3)")
    assert rows_of(workers, "SELECT 1") == [1]
