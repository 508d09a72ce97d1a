"""``lockstep emit``: send one command to the coordinator and print its outcome (the low-level API)."""

from __future__ import annotations

import click

from coordinator.client.commands import new_request_id
from coordinator.domain import (
    AcquireLease,
    DeclareTable,
    DeregisterJob,
    DropTable,
    RegisterJob,
    ReleaseLease,
    RequestRevision,
)
from coordinator.domain.events import END_STATUSES, TableKind
from lockstep.cli.common import send, split_csv


@click.group("emit")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the outcome.")
@click.option("--request-id", default=None, help="Request id (default: a fresh one).")
@click.pass_context
def emit_group(ctx: click.Context, timeout: float, request_id: str | None) -> None:
    """Send a command to the coordinator and print its outcome.

    Exit 0 accepted, 1 rejected (the reason is printed), 3 broker/coordinator unreachable.
    """
    ctx.meta["timeout"] = timeout
    ctx.meta["request_id"] = request_id or new_request_id()


@emit_group.command("declare-table")
@click.argument("name")
@click.option("--kind", type=click.Choice([kind.value for kind in TableKind]), required=True,
              help="root: fed by Kafka topics; intermediate: written from other tables.")
@click.option("--primary-key", help="Comma-separated key columns (an upsert table).")
@click.option("--schema", default="", help="Column DDL, e.g. 'user_id BIGINT, amount BIGINT'.")
@click.pass_context
def emit_declare_table(ctx: click.Context, name: str, kind: str, primary_key: str | None, schema: str) -> None:
    """Declare table NAME, a root or intermediate table."""
    send(ctx.obj, DeclareTable(ctx.meta["request_id"], name, kind, split_csv(primary_key), schema), ctx.meta["timeout"])


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
    send(ctx.obj, command, ctx.meta["timeout"])


@emit_group.command("deregister-job")
@click.argument("job_id")
@click.option("--status", type=click.Choice([status.value for status in END_STATUSES]), required=True,
              help="How it ended.")
@click.option("--reason", default="", help="Why, recorded with the status.")
@click.pass_context
def emit_deregister_job(ctx: click.Context, job_id: str, status: str, reason: str) -> None:
    """Record that job JOB_ID ended."""
    send(ctx.obj, DeregisterJob(ctx.meta["request_id"], job_id, status, reason), ctx.meta["timeout"])


@emit_group.command("acquire-lease")
@click.argument("lease_id")
@click.option("--holder", required=True, help="Who holds the lease, for the record (e.g. user@host:pid).")
@click.option("--tables", required=True, help="Comma-separated tables.")
@click.option("--barrier", type=int, required=True, help="The exact point whose versions to hold.")
@click.option("--ttl-ms", type=int, default=60_000, show_default=True,
              help="Milliseconds the lease lasts unless renewed (acquire it again with the same id).")
@click.pass_context
def emit_acquire_lease(ctx: click.Context, lease_id: str, holder: str, tables: str, barrier: int, ttl_ms: int) -> None:
    """Hold table versions at a barrier against VACUUM, as lease LEASE_ID (the same id renews)."""
    command = AcquireLease(ctx.meta["request_id"], lease_id, holder, split_csv(tables), barrier, ttl_ms)
    send(ctx.obj, command, ctx.meta["timeout"])


@emit_group.command("release-lease")
@click.argument("lease_id")
@click.pass_context
def emit_release_lease(ctx: click.Context, lease_id: str) -> None:
    """Release lease LEASE_ID."""
    send(ctx.obj, ReleaseLease(ctx.meta["request_id"], lease_id), ctx.meta["timeout"])


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
    send(ctx.obj, command, ctx.meta["timeout"])


@emit_group.command("drop-table")
@click.argument("name")
@click.option("--reason", default="", help="Why, for the record.")
@click.pass_context
def emit_drop_table(ctx: click.Context, name: str, reason: str) -> None:
    """Remove table NAME and its exact points from the catalog (files untouched; `lockstep drop` removes them too)."""
    send(ctx.obj, DropTable(ctx.meta["request_id"], name, reason), ctx.meta["timeout"])
