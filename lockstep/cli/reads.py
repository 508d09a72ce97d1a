"""Reading and keeping tables: ``query`` (at one consistent barrier) and ``vacuum``."""

from __future__ import annotations

import csv
import dataclasses
import json
import sys

import click
from rich.console import Console
from rich.table import Table

from coordinator.client.rest import get_json
from coordinator.domain.errors import LockstepError, NotStarted, Terminated, Unreachable, check_known
from coordinator.domain.snapshot import ReadLevel
from coordinator.settings import Settings
from lockstep.cli.common import echo_json, format_option, parse_when

LEVEL_CHOICE = click.Choice([level.value for level in ReadLevel])


@click.command()
@click.argument("sql")
@click.option("--consistency", type=LEVEL_CHOICE, default=ReadLevel.READ_COMMITTED.value, show_default=True,
              help="Read level (docs/concepts.md: read levels).")
@click.option("--as-of-barrier", type=click.IntRange(1), help="Read every table at this barrier's exact point.")
@click.option("--as-of-timestamp", help="Read at the newest barrier announced at or before this time "
              "(epoch ms or ISO-8601, e.g. 2026-11-21T20:00:00).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True,
              help="table for people; json (a JSON object per row, JSON Lines) or csv for scripts")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1), help="At most this many rows.")
@click.option("--engine", type=click.Choice(["light", "spark"]), default="light", show_default=True,
              help="light: delta-rs and DataFusion in this process, PostgreSQL's SQL dialect, milliseconds; "
                   "spark: a Spark session, Spark SQL, seconds to start (docs/reads.md: dialects)")
@click.pass_obj
def query(settings: Settings, sql: str, consistency: str, as_of_barrier: int | None, as_of_timestamp: str | None,
          fmt: str, limit: int, engine: str) -> None:
    """Run SQL over the tables at one consistent barrier.

    The result goes to stdout; the barrier and the version of each table read go to stderr.
    Exit 0 on success, 1 if the read is not possible (unknown table, no exact point, bad SQL),
    3 if the coordinator is unreachable.

    \b
    lockstep query "SELECT * FROM user_item_amount ORDER BY total_amount DESC LIMIT 5"
    lockstep query "SELECT COUNT(*) FROM shopping" --as-of-barrier 120 --format csv
    """
    if as_of_barrier is not None and as_of_timestamp is not None:
        raise click.UsageError("give --as-of-barrier or --as-of-timestamp, not both")
    at_ms = parse_when(as_of_timestamp) if as_of_timestamp else None
    if engine == "spark":
        columns, rows = _spark_query(settings, sql, consistency, as_of_barrier, at_ms, limit)
    else:
        from lockstep_reads import query as light_query

        result = light_query(sql, consistency, as_of_barrier, at_ms, settings, limit=limit)
        if result.versions:
            _say_read(result.barrier, result.versions)
        columns, rows = result.table.column_names, [tuple(r.values()) for r in result.table.to_pylist()]
    _print_rows(columns, rows, fmt)


def _say_read(barrier: int | None, versions: dict[str, int | None]) -> None:
    click.echo(f"barrier {barrier if barrier is not None else '(latest versions)'}; versions "
               + ", ".join(f"{t}={v if v is not None else 'latest'}" for t, v in versions.items()), err=True)


def _spark_query(settings: Settings, sql: str, consistency: str, as_of_barrier: int | None, at_ms: int | None,
                 limit: int) -> tuple[list[str], list[tuple]]:
    """The query through a Spark session of its own (Spark SQL)."""
    from lockstep_reads.snapshot import open_snapshot
    from lockstep_reads.spark import referenced_tables
    from lockstep_reads.statements import QueryError, require_spark_read
    from spark_jobs.api.lineage import register_lineage_views
    from spark_jobs.runtime.session import build_session, spark_error

    require_spark_read(sql)  # before a JVM starts: one query, no writes, jars, JVM calls or file paths
    tables = referenced_tables(sql)
    if tables:
        check_known(tables, get_json(settings, "/topology")["tables"])
    spark = build_session("lockstep-query", settings=settings)
    try:
        if not tables:  # only lineage tables: nothing to pin to a barrier
            register_lineage_views(spark, settings)
            frame = spark.sql(sql)
            return frame.columns, [tuple(r) for r in frame.limit(limit).collect()]
        with open_snapshot(tables, consistency, as_of_barrier, at_ms, settings, spark=spark) as snap:
            _say_read(snap.barrier, snap.versions)
            frame = snap.sql(sql)
            return frame.columns, [tuple(r) for r in frame.limit(limit).collect()]
    except LockstepError:
        raise
    except Exception as exc:  # noqa: BLE001 - Spark analysis errors (unknown column, ...) are the user's to fix
        raise QueryError(spark_error(exc)) from exc


def _print_rows(columns: list[str], rows: list[tuple], fmt: str) -> None:
    if fmt == "json":
        for row in rows:
            click.echo(json.dumps(dict(zip(columns, row, strict=True)), default=str))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        table = Table(*columns)
        for row in rows:
            table.add_row(*["NULL" if v is None else str(v) for v in row])
        Console().print(table)


def _limit(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """A ``serve`` limit flag as ms or bytes (``lockstep_reads.pgwire.limits``), or a usage error."""
    from lockstep_reads.pgwire import limits

    try:
        return (limits.size_bytes if param.name == "max_result_size" else limits.duration_ms)(param.name or "", value)
    except limits.LimitError as exc:
        raise click.BadParameter(str(exc).split(": ", 1)[1]) from None


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; another than loopback needs LOCKSTEP_SERVE_PASSWORD.")
@click.option("--port", default=5433, show_default=True, type=click.IntRange(1, 65535),
              help="Port to listen on (5432 is the local PostgreSQL's).")
@click.option("--trust", type=click.Choice(["loopback", "none"]), default="loopback", show_default=True,
              help="loopback: clients on this machine's loopback need no password; none: every client proves "
                   "LOCKSTEP_SERVE_PASSWORD (SCRAM-SHA-256).")
@click.option("--max-connections", default=200, show_default=True, type=click.IntRange(1),
              help="More clients than this are turned away (SQLSTATE 53300).")
@click.option("--workers", default=4, show_default=True, type=click.IntRange(1, 64),
              help="Query processes: how many reads run at once (more wait for one, within their timeout).")
@click.option("--statement-timeout", default="60s", show_default=True, callback=_limit,
              help="A statement running longer is stopped (57014); 0 never. Clients may SET statement_timeout.")
@click.option("--max-result-size", default="1GB", show_default=True, callback=_limit,
              help="A result larger than this ends in an error (53200); 0 no limit. Clients may SET max_result_size.")
@click.option("--idle-in-transaction-timeout", default="2min", show_default=True, callback=_limit,
              help="A session idle this long inside BEGIN ... COMMIT ends (25P03) and its lease goes; 0 never.")
@click.pass_obj
def serve(settings: Settings, host: str, port: int, trust: str, max_connections: int, workers: int,
          statement_timeout: int, max_result_size: int, idle_in_transaction_timeout: int) -> None:
    """Serve the tables to PostgreSQL clients: psql, psycopg, JDBC, BI tools.

    User and database are lockstep. Every statement reads one read-committed snapshot of the
    tables it names; BEGIN ISOLATION LEVEL REPEATABLE READ holds one snapshot (and its lease)
    until COMMIT or ROLLBACK; SET lockstep.as_of_barrier = B reads the past, SHOW
    lockstep.barrier says what the last read read. Writes and DDL are refused. Ctrl-C or
    SIGTERM stops it (exit 130 or 143); exit 4 if the port is taken.

    \b
    lockstep serve --port 5433
    psql -h 127.0.0.1 -p 5433 -U lockstep -d lockstep -c "SELECT * FROM views_per_page"
    """
    import asyncio
    import signal

    from lockstep_reads.pgwire.auth import trusted
    from lockstep_reads.pgwire.limits import Limits
    from lockstep_reads.pgwire.server import WireServer

    if not settings.serve_password and (trust == "none" or not trusted(host, "loopback")):
        raise click.UsageError(f"--host {host} --trust {trust} lets clients in that must prove a password: set "
                               "LOCKSTEP_SERVE_PASSWORD (docs/reads.md: lockstep serve)")
    try:
        get_json(settings, "/health", timeout=3)
    except Unreachable as exc:
        click.echo(f"warning: {exc}; statements fail until it answers", err=True)
    limits = Limits(statement_timeout_ms=statement_timeout, idle_in_transaction_ms=idle_in_transaction_timeout,
                    max_result_bytes=max_result_size)
    server = WireServer(settings, host, port, trust, settings.serve_password, max_connections, workers, limits)
    stopped_by: list[int] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, lambda s=signum: (stopped_by.append(s), server.stop()))
        await server.serve(ready=lambda: click.echo(
            f"serving Lockstep's tables on {host}:{port} to PostgreSQL clients: psql -h {host} -p {port} -U lockstep "
            "-d lockstep (Ctrl-C stops)", err=True))

    try:
        asyncio.run(run())
    except OSError as exc:
        raise NotStarted(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another with --port") from exc
    if stopped_by:
        raise Terminated() if stopped_by[0] == signal.SIGTERM else KeyboardInterrupt()


@click.command("vacuum")
@click.argument("tables", nargs=-1)
@click.option("--dry-run", is_flag=True, help="List the files that would go and why the rest stays; delete nothing.")
@click.option("--retain-barriers", type=click.IntRange(0), default=None,
              help="Also keep the exact points of this many newest barriers "
                   "(default: LOCKSTEP_RETAIN_BARRIERS, else 100; 0 keeps only what someone needs now).")
@click.option("--list-files", "show_files", default=20, show_default=True, type=click.IntRange(0),
              help="Print at most this many file names per table.")
@format_option()
@click.pass_obj
def vacuum(settings: Settings, tables: tuple[str, ...], dry_run: bool, retain_barriers: int | None,
           show_files: int, fmt: str) -> None:
    """Delete old Delta files of TABLES (default: every table) that nobody needs any more.

    A version stays readable while a repeatable-read lease holds it, a running job reads from
    it next, it is a table's newest exact point or the one read-committed readers pick now, or
    it is the exact point of one of the newest --retain-barriers barriers. Older versions'
    files go; reading them afterwards fails with a clear "vacuumed" error.

    Exit 0 done, 1 unknown table, 3 the broker (where the coordinator's state lives) unreachable.
    """
    from coordinator.client.state import read_state
    from spark_jobs.ops.vacuum import vacuum as vacuum_tables
    from spark_jobs.runtime.session import build_session

    try:
        state = read_state(settings)
    except Exception as exc:  # noqa: BLE001 - Kafka errors come in many types; all mean the same here
        raise Unreachable(f"cannot read the coordinator's state from {settings.bootstrap}: {exc}") from exc
    check_known(tables, state.tables)
    spark = build_session("lockstep-vacuum", settings=settings)
    reports = vacuum_tables(spark, settings, tables, retain_barriers, dry_run, state=state)
    if fmt == "json":  # every file, whatever --list-files says
        echo_json({"tables": [dataclasses.asdict(report) for report in reports]})
        return
    for report in reports:
        verb = "would delete" if dry_run else "deleted"
        for folder in report.stale:
            click.echo(f"{report.table}: {verb} streaming state that is not this table's: {folder}")
        if report.floor is None:
            click.echo(f"{report.table}: no Delta table yet; nothing to vacuum")
            continue
        click.echo(f"{report.table}: {verb} {len(report.files)} file(s); versions >= {report.floor} stay readable")
        for keep in report.keeps:
            click.echo(f"  keeps version {keep.version}: {keep.reason}")
        for name in report.files[:show_files]:
            click.echo(f"  {verb}: {name}")
        if len(report.files) > show_files:
            click.echo(f"  ... and {len(report.files) - show_files} more")
