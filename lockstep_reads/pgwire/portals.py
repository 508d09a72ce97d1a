"""A statement on its way to the client: its prepared form, its portal (the rows still to send,
Execute may ask for some at a time) and the batches those rows come in, from a query worker
(``workers.Rows``) or a table answered in this process."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from lockstep_reads.pgwire.session import Outcome
from lockstep_reads.statements import Statement


class Batches(Protocol):
    """Rows a batch at a time: a query worker's (``workers.Rows``) or a table's."""

    schema: pa.Schema

    def ready(self) -> bool: ...

    def next(self) -> pa.RecordBatch | None: ...


class TableBatches:
    """A table answered in this process (the catalog, SHOW) as ``Batches``."""

    def __init__(self, table: pa.Table) -> None:
        self.schema = table.schema
        self._batches = iter(table.to_batches())

    def ready(self) -> bool:
        return True

    def next(self) -> pa.RecordBatch | None:
        return next(self._batches, None)


@dataclass
class Prepared:
    statement: Statement
    parameter_types: list[int]


@dataclass
class Portal:
    statement: Statement
    result_formats: tuple[int, ...]
    outcome: Outcome | None = None
    batches: Batches | None = None  # its rows still to send (Execute may ask for some at a time)
    pending: pa.RecordBatch | None = None  # a batch taken and not sent yet
    sent: int = 0
    done: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # frees its query worker
    expired: bool = False  # suspended past its statement's timeout: its worker was freed
    timer: asyncio.TimerHandle | None = None  # while suspended: when it expires

    def close(self) -> None:
        self.wake()
        self.done.close()

    def wake(self) -> None:
        """An Execute comes (or the end): no expiry while it runs."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def expire(self) -> None:
        self.timer = None
        self.expired = True
        self.close()
