"""What several command groups share: reaching the coordinator, printing outcomes and tables."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from coordinator.client.commands import emit
from coordinator.domain import Command, CommandOutcome
from coordinator.domain.errors import Rejected, Terminated
from coordinator.domain.roles import Role
from coordinator.domain.snapshot import epoch_ms
from coordinator.settings import Settings
from lockstep import signals

if TYPE_CHECKING:
    from spark_jobs.planning.pipeline import Pipeline


class Stopping:
    """A stop asked for by a signal (``stop_signals``): ``event`` is set; ``check()`` raises what
    the signal means (Ctrl-C: KeyboardInterrupt, exit 130; SIGTERM: Terminated, exit 143)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: int | None = None
        self._handler: Any = None

    def reclaim(self) -> None:
        """Take Ctrl-C back after something replaced its handler: starting a SparkContext sets
        one that cancels every Spark job at once, which would cut a barrier in progress off."""
        signal.signal(signal.SIGINT, self._handler)

    def check(self) -> None:
        if self.signal is not None:
            raise Terminated() if self.signal == signal.SIGTERM else KeyboardInterrupt()


@contextmanager
def stop_signals() -> Iterator[Stopping]:
    """Ctrl-C and SIGTERM ask a long-running command to stop at its next step instead of
    interrupting whatever runs (a Spark call, a Kafka read) in the middle; a second signal
    interrupts at once.

    Example::

        with stop_signals() as stopping:
            while not stopping.event.wait(1.0):
                work()
            stopping.check()  # raises if a signal ended the loop
    """
    stopping = Stopping()

    def asked(signum: int, frame: FrameType | None) -> None:
        signals.noted(signum)
        if stopping.signal is not None:
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
        stopping.signal = signum
        stopping.event.set()

    stopping._handler = asked
    previous = {s: signal.signal(s, asked) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopping
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def format_option(*extra: str) -> Any:
    """``--format table|json`` (and ``extra`` forms) for a command that prints data: a table for
    people, JSON for scripts."""
    return click.option("--format", "fmt", type=click.Choice(["table", "json", *extra]), default="table",
                        show_default=True, help="table for people, json for scripts")


def echo_json(body: Any) -> None:
    """Print ``body`` as JSON, keys sorted (what ``--format json`` prints)."""
    click.echo(json.dumps(body, indent=2, sort_keys=True))


def send(settings: Settings, command: Command, timeout: float, role: Role | None = None) -> CommandOutcome:
    """Emit ``command`` as ``role`` (default: the command's usual sender) and print its outcome; a
    rejection raises ``Rejected`` (exit 1)."""
    outcome = emit(settings, command, timeout, role)
    if not outcome.accepted:
        raise Rejected(f"{outcome.command} {outcome.request_id}: {outcome.reason}")
    keys = f" ({', '.join(outcome.keys)})" if outcome.keys else " (no change: already so)"
    click.echo(f"accepted: {outcome.command} {outcome.request_id}{keys}")
    return outcome


def load(*paths: str | Path) -> Pipeline:
    """Parse pipeline files, SQL (sqlglot) or Python (run, functions not called; no Spark) into one
    pipeline; a bad one raises ``PipelineError`` (exit 2) naming the file."""
    from spark_jobs.planning.pipeline import PipelineError, joined, load_pipeline

    pipelines = []
    for path in paths:
        try:
            pipelines.append(load_pipeline(Path(path)))
        except PipelineError as exc:
            raise PipelineError(f"{path}: {exc}") from exc
    return joined(pipelines)


def split_csv(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def parse_when(value: str) -> int:
    """Epoch milliseconds, or an ISO-8601 time (UTC unless it says otherwise); a bad one is a usage error.

    Example::

        >>> parse_when("2026-11-21T20:00:00"), parse_when("1795291200000")
        (1795291200000, 1795291200000)
    """
    try:
        return epoch_ms(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def delay_tables(body: dict[str, Any], window: str) -> list[Table]:
    """The /delays report as terminal tables: tables, jobs with the bottleneck marked, phases."""

    def ms(value: int | None) -> str:
        return "-" if value is None else f"{value / 1000:.2f} s"

    tables = Table("table", "latest exact barrier", "lag (barriers)", "staleness p50", "staleness p99", "E2E p50",
                   "E2E p99", title=f"tables ({window}; staleness: now - time of the newest barrier readable)")
    for name, t in body["tables"].items():
        tables.add_row(name, str(t["latest_exact_barrier"] or "-"), str(t["lag_barriers"]),
                       ms(t.get("staleness_p50_ms")), ms(t.get("staleness_p99_ms")), ms(t["e2e_p50_ms"]),
                       ms(t["e2e_p99_ms"]))
    jobs = Table("job", "sink", "status", "own delay p50", "own delay p99", "")
    for job, j in body["jobs"].items():
        jobs.add_row(job, j["sink"], j["status"], ms(j["own_p50_ms"]), ms(j["own_p99_ms"]),
                     "bottleneck" if job == body["bottleneck"] else "")
    names = list(dict.fromkeys(n for j in body["jobs"].values() for n in j.get("phases_p50_ms", {})))
    if not names:
        return [tables, jobs]
    phases = Table("job", *names, title="where a barrier's time goes in each job (p50, ms)")
    for job, j in body["jobs"].items():
        phases.add_row(job, *(str(j.get("phases_p50_ms", {}).get(n, "-")) for n in names))
    return [tables, jobs, phases]
