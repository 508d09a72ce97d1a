"""``lockstep emit``: send one command to the coordinator and print its outcome (the low-level API)."""

from __future__ import annotations

import secrets

import click

from coordinator.client.commands import new_request_id
from coordinator.domain import (
    AcquireLease,
    Command,
    DeclareTable,
    DeregisterJob,
    DropTable,
    RegisterJob,
    ReleaseLease,
    RequestRevision,
)
from coordinator.domain.events import END_STATUSES, TableKind
from coordinator.domain.roles import Role
from lockstep.cli.common import send, split_csv


@click.group("emit")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the outcome.")
@click.option("--request-id", default=None, help="Request id (default: a fresh one).")
@click.option("--as", "role", type=click.Choice([r.value for r in Role]), default=None,
              help="Send it as this role, to its command topic (default: the command's usual sender; "
                   "docs/security.md has the table).")
@click.pass_context
def emit_group(ctx: click.Context, timeout: float, request_id: str | None, role: str | None) -> None:
    """Send a command to the coordinator and print its outcome.

    Exit 0 accepted, 1 rejected (the reason is printed), 3 broker/coordinator unreachable.
    """
    ctx.meta["timeout"] = timeout
    ctx.meta["request_id"] = request_id or new_request_id()
    ctx.meta["role"] = Role(role) if role else None


def _send(ctx: click.Context, command: Command) -> None:
    send(ctx.obj, command, ctx.meta["timeout"], ctx.meta["role"])


@emit_group.command("declare-table")
@click.argument("name")
@click.option("--kind", type=click.Choice([kind.value for kind in TableKind]), required=True,
              help="root: fed by Kafka topics; intermediate: written from other tables.")
@click.option("--primary-key", help="Comma-separated key columns (an upsert table).")
@click.option("--schema", default="", help="Column DDL, e.g. 'user_id BIGINT, amount BIGINT'.")
@click.pass_context
def emit_declare_table(ctx: click.Context, name: str, kind: str, primary_key: str | None, schema: str) -> None:
    """Declare table NAME, a root or intermediate table."""
    _send(ctx, DeclareTable(ctx.meta["request_id"], name, kind, split_csv(primary_key), schema))


@emit_group.command("register-job")
@click.argument("job_id")
@click.option("--sink", required=True, help="The one table this job writes.")
@click.option("--sources", help="Comma-separated tables it reads (intermediate jobs).")
@click.option("--topics", help="Comma-separated external Kafka topics it reads (root jobs).")
@click.option("--sql", default="", help="The job's query, for the record.")
@click.pass_context
def emit_register_job(ctx: click.Context, job_id: str, sink: str, sources: str | None, topics: str | None, sql: str) -> None:
    """Register job JOB_ID, the one that writes a table."""
    command = RegisterJob(ctx.meta["request_id"], job_id, sink, split_csv(sources), split_csv(topics), sql)
    _send(ctx, command)


@emit_group.command("deregister-job")
@click.argument("job_id")
@click.option("--status", type=click.Choice([status.value for status in END_STATUSES]), required=True,
              help="How it ended.")
@click.option("--reason", default="", help="Why, recorded with the status.")
@click.pass_context
def emit_deregister_job(ctx: click.Context, job_id: str, status: str, reason: str) -> None:
    """Record that job JOB_ID ended."""
    _send(ctx, DeregisterJob(ctx.meta["request_id"], job_id, status, reason))


@emit_group.command("acquire-lease")
@click.argument("lease_id")
@click.option("--holder", required=True, help="Who holds the lease, for the record (e.g. user@host:pid).")
@click.option("--tables", required=True, help="Comma-separated tables.")
@click.option("--barrier", type=int, required=True, help="The exact point whose versions to hold.")
@click.option("--ttl-ms", type=int, default=60_000, show_default=True,
              help="Milliseconds the lease lasts unless renewed (acquire it again with the same id).")
@click.option("--secret", envvar="LOCKSTEP_LEASE_SECRET", default=None,
              help="The holder's secret: renewing and releasing need it [env LOCKSTEP_LEASE_SECRET; default: "
                   "a new one, printed once].")
@click.pass_context
def emit_acquire_lease(ctx: click.Context, lease_id: str, holder: str, tables: str, barrier: int, ttl_ms: int,
                       secret: str | None) -> None:
    """Hold table versions at a barrier against VACUUM, as lease LEASE_ID (the same id and secret renew)."""
    if not secret:
        secret = secrets.token_hex(16)
        click.echo(f"lease secret: {secret} (renewing and releasing need it: --secret or LOCKSTEP_LEASE_SECRET)",
                   err=True)
    _send(ctx, AcquireLease(ctx.meta["request_id"], lease_id, holder, split_csv(tables), barrier, ttl_ms, secret))


@emit_group.command("release-lease")
@click.argument("lease_id")
@click.option("--secret", envvar="LOCKSTEP_LEASE_SECRET", default="",
              help="The secret the lease was taken with [env LOCKSTEP_LEASE_SECRET]; an operator (--as operator) "
                   "releases any lease without it.")
@click.pass_context
def emit_release_lease(ctx: click.Context, lease_id: str, secret: str) -> None:
    """Release lease LEASE_ID."""
    _send(ctx, ReleaseLease(ctx.meta["request_id"], lease_id, secret))


@emit_group.command("request-revision")
@click.argument("table")
@click.option("--to-barrier", type=int, required=True,
              help="Keep the exact points up to this barrier; recompute after it (ignored with --full).")
@click.option("--full", is_flag=True, help="Recompute from scratch.")
@click.option("--expected-generation", type=int, default=None, help="Reject if the table moved on.")
@click.pass_context
def emit_request_revision(ctx: click.Context, table: str, to_barrier: int, full: bool, expected_generation: int | None) -> None:
    """Revise TABLE and its downstream closure back to a barrier."""
    command = RequestRevision(ctx.meta["request_id"], table, to_barrier, full, expected_generation)
    _send(ctx, command)


@emit_group.command("drop-table")
@click.argument("name")
@click.option("--reason", default="", help="Why, for the record.")
@click.pass_context
def emit_drop_table(ctx: click.Context, name: str, reason: str) -> None:
    """Remove table NAME and its exact points from the catalog (files untouched; `lockstep drop` removes them too)."""
    _send(ctx, DropTable(ctx.meta["request_id"], name, reason))
