"""The ``lockstep`` command.

Exit codes scripts can trust: 0 success, 1 the operation failed or a command was rejected
(the message says why), 2 bad usage or broker/coordinator unreachable, 3 ``dev status``
found the broker stopped.
"""

from __future__ import annotations

import getpass
import json
import socket
import sys
import threading
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from coordinator.client.commands import emit, new_request_id
from coordinator.client.rest import Unreachable, get_json
from coordinator.dev.broker import BrokerError, BrokerStatus, LocalBroker
from coordinator.domain import (
    AcquireLease,
    Command,
    CommandOutcome,
    DeclareTable,
    DeregisterJob,
    DropTable,
    RegisterJob,
    ReleaseLease,
    RequestRevision,
)
from coordinator.settings import Settings, SettingsError


def local_broker(settings: Settings) -> LocalBroker:
    """The broker ``lockstep dev`` manages: ``$LOCKSTEP_HOME/kafka`` on ``LOCKSTEP_BOOTSTRAP``'s port."""
    broker = LocalBroker.for_settings(settings)
    if broker is None:
        raise click.UsageError(
            f"LOCKSTEP_BOOTSTRAP={settings.bootstrap} is not on 127.0.0.1; the local broker only "
            "runs on loopback. Unset it or use 127.0.0.1:<port>."
        )
    return broker


def describe(status: BrokerStatus) -> str:
    if not status.running:
        return f"broker: stopped (bootstrap {status.bootstrap})"
    topics = "not answering" if status.topics is None else f"{status.topics} topics"
    return f"broker: running, pid {status.pid}, bootstrap {status.bootstrap}, {topics}"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Lockstep: consistent streaming ETL on the lakehouse.

    Configuration comes from LOCKSTEP_* environment variables (see README):
    LOCKSTEP_BOOTSTRAP, LOCKSTEP_HOME, LOCKSTEP_WAREHOUSE, LOCKSTEP_JARS,
    LOCKSTEP_COORDINATOR_URL, and LOCKSTEP_KAFKA_* for Kafka client settings.
    """
    try:
        ctx.obj = Settings.from_env()
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from exc


@cli.group()
def dev() -> None:
    """Run the local development stack (a real single-node KRaft Kafka broker on 127.0.0.1)."""


@dev.command()
@click.option("--timeout", default=90.0, show_default=True, help="Seconds to wait for the broker to answer.")
@click.pass_obj
def up(settings: Settings, timeout: float) -> None:
    """Start the local broker (formats storage the first time); harmless if it already runs."""
    broker = local_broker(settings)
    already = broker.running_pid() is not None
    try:
        status = broker.up(timeout=timeout)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(("already running; " if already else "started; ") + describe(status))


@dev.command()
@click.pass_obj
def down(settings: Settings) -> None:
    """Stop the local broker this checkout started (by its pid) and wait for it to exit."""
    broker = local_broker(settings)
    click.echo("broker stopped" if broker.down() else "broker was not running")


@dev.command()
@click.pass_obj
def status(settings: Settings) -> None:
    """Say whether the local broker runs: pid, bootstrap address, topic count. Exit 3 if stopped."""
    state = local_broker(settings).status()
    click.echo(describe(state))
    if not state.running:
        sys.exit(3)


@cli.command()
@click.option("--seconds", default=60.0, show_default=True, type=click.FloatRange(min=1), help="How long to read.")
@click.option("--warmup", default=30.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds of purchases and reads first, not counted (the JVMs compile their hot code).")
@click.option("--rate", default=1000, show_default=True, type=click.IntRange(1), help="Purchases per second generated.")
@click.option("--users", default=100, show_default=True, type=click.IntRange(1), help="Distinct users.")
@click.option("--items", default=20, show_default=True, type=click.IntRange(1), help="Distinct items.")
@click.option("--pipeline", "pipeline_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="The pipeline to run (default: pipelines/shopping.sql).")
@click.pass_obj
def demo(settings: Settings, seconds: float, warmup: float, rate: int, users: int, items: int,
         pipeline_file: Path | None) -> None:
    """FLIP-276's shopping pipeline, live, read at every level.

    Starts (or reuses) the local broker and a coordinator worker, runs pipelines/shopping.sql
    (shopping -> user_item_amount = SUM(amount), user_item_price = SUM(price)), generates
    purchases in which every item has a fixed unit price, and runs FLIP-276's join of the two
    tables again and again at each read level. A row whose average price total_price /
    total_amount is not the unit price is an anomaly: numbers that never existed. The view
    shows reads, anomalies and staleness per level; at the end, a summary and the E2E delays.

    Exit 0 only if read-committed and repeatable-read each read and saw zero anomalies; 1 if
    they saw any (or never got to read); 2 if a part could not start; 130 on Ctrl-C. Whatever
    the demo started, it stops.
    """
    from spark_jobs.demo import SHOPPING, DemoError, DemoOptions, level_table, run_demo

    console = Console(width=None if sys.stdout.isatty() else 120)
    options = DemoOptions(seconds=seconds, warmup=warmup, rate=rate, users=users, items=items,
                          pipeline=pipeline_file or SHOPPING)
    try:
        result = run_demo(settings, options, say=lambda line: console.print(line, markup=False, highlight=False),
                          console=console)
    except (DemoError, BrokerError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    console.print(level_table(result.stats, title=f"summary: {result.seconds:.0f} s, {result.purchases:,} purchases"))
    for table in delay_tables(result.delays, "this run's barriers") if result.delays else ():
        console.print(table)
    rc, rr, ru = (result.stats[level] for level in ("read-committed", "repeatable-read", "read-uncommitted"))
    click.echo(f"read-uncommitted: {ru.anomalous_reads} of {ru.reads} reads returned numbers that never existed "
               f"({ru.anomalous_rows} rows); allowed at that level")
    if result.interrupted:
        sys.exit(130)
    if not result.ok:
        click.echo(f"FAILED: read-committed {rc.anomalous_reads} of {rc.reads} reads and repeatable-read "
                   f"{rr.anomalous_reads} of {rr.reads} reads had anomalies (both must read and see none)", err=True)
        sys.exit(1)
    click.echo(f"OK: read-committed ({rc.reads} reads) and repeatable-read ({rr.reads} reads) saw zero anomalies")


@cli.group()
def datagen() -> None:
    """Generate input for a pipeline into Kafka."""


@datagen.command("shopping")
@click.option("--rate", default=1000, show_default=True, type=click.IntRange(1), help="Purchases per second.")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), help="Stop after this long (default: until Ctrl-C).")
@click.option("--users", default=100, show_default=True, type=click.IntRange(1), help="Distinct users.")
@click.option("--items", default=20, show_default=True, type=click.IntRange(1), help="Distinct items.")
@click.option("--topic", default="shopping_source", show_default=True, help="The topic pipelines/shopping.sql reads.")
@click.option("--partitions", default=2, show_default=True, type=click.IntRange(1), help="Partitions if the topic is new.")
@click.option("--seed", default=7, show_default=True, type=int, help="Random seed (same seed, same purchases).")
@click.pass_obj
def datagen_shopping(settings: Settings, rate: int, seconds: float | None, users: int, items: int, topic: str,
                     partitions: int, seed: int) -> None:
    """Produce FLIP-276 purchases {user_id, item_id, amount, price, ts} at a steady rate.

    Every item has a fixed unit price, 0.25 x (4 + item_id mod 37), and price = amount x unit
    price, so in any consistent read total_price / total_amount of a (user, item) is the unit
    price; ts is the produce time (epoch ms). Creates the topic if needed, reports progress
    every 5 s, and on Ctrl-C or SIGTERM flushes and stops. Exit 1 if some purchases could not
    be delivered.

    \b
    lockstep datagen shopping --rate 10000 --seconds 60
    """
    import signal

    from confluent_kafka import KafkaException

    from spark_jobs.datagen import RateGenerator, ensure_topic, purchases

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        if ensure_topic(settings, topic, partitions):
            click.echo(f"created topic {topic} ({partitions} partitions)")
        generator = RateGenerator(settings, topic, rate, purchases(users, items), seed)
    except KafkaException as exc:
        click.echo(f"error: Kafka at {settings.bootstrap}: {exc}", err=True)
        sys.exit(2)
    click.echo(f"producing {rate:,} purchases/s to {topic} on {settings.bootstrap} (Ctrl-C stops)")
    sent = generator.run(stop, seconds, progress=click.echo)
    click.echo(f"sent {sent:,} purchases; {generator.failed} not delivered")
    if generator.failed:
        sys.exit(1)


# -- coordinator ----------------------------------------------------------------------------------


@cli.command()
@click.option("--web-port", type=int, help="Port of the REST API (default: from LOCKSTEP_COORDINATOR_URL, 6066).")
@click.option("--loglevel", default="info", show_default=True, type=click.Choice(["debug", "info", "warn", "error", "crit"]))
def worker(web_port: int | None, loglevel: str) -> None:
    """Run the coordinator (a Faust worker): decides commands, announces barriers on the leader,
    serves the REST API. Run two for failover (give the second its own --web-port)."""
    import os

    if web_port is not None:
        os.environ["LOCKSTEP_COORDINATOR_URL"] = f"http://127.0.0.1:{web_port}"
    from coordinator.stream.app import app

    sys.argv = ["lockstep-worker", "worker", "--loglevel", loglevel,
                "--web-host", app.conf.web_host, "--web-port", str(app.conf.web_port)]
    app.main()


def delay_tables(body: dict[str, Any], window: str) -> list[Table]:
    """The /delays report as two terminal tables: tables, then jobs with the bottleneck marked."""

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


def print_outcome(outcome: CommandOutcome) -> None:
    if outcome.accepted:
        keys = f" ({', '.join(outcome.keys)})" if outcome.keys else " (no change: already so)"
        click.echo(f"accepted: {outcome.command} {outcome.request_id}{keys}")
    else:
        click.echo(f"rejected: {outcome.command} {outcome.request_id}: {outcome.reason}", err=True)
        sys.exit(1)


def send(settings: Settings, command: Command, timeout: float) -> CommandOutcome:
    """Emit ``command`` and print its outcome; exit 1 if rejected, 2 if the broker is unreachable."""
    try:
        outcome = emit(settings, command, timeout)
    except Unreachable as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    print_outcome(outcome)
    return outcome


def exit_if_unknown(tables: Sequence[str], registered: Collection[str]) -> None:
    """Exit 1 naming the tables that are not registered (checked before Spark starts)."""
    unknown = [t for t in tables if t not in registered]
    if unknown:
        click.echo(f"error: unknown table(s): {', '.join(unknown)}; registered: {', '.join(sorted(registered))}", err=True)
        sys.exit(1)


def split_csv(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


@cli.group()
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the outcome.")
@click.option("--request-id", default=None, help="Request id (default: a fresh one).")
@click.pass_context
def emit_group(ctx: click.Context, timeout: float, request_id: str | None) -> None:
    """Send a command to the coordinator and print its outcome.

    Exit 0 accepted, 1 rejected (the reason is printed), 2 broker/coordinator unreachable.
    """
    ctx.meta["timeout"] = timeout
    ctx.meta["request_id"] = request_id or new_request_id()


@emit_group.command("declare-table")
@click.argument("name")
@click.option("--kind", type=click.Choice(["root", "intermediate"]), required=True)
@click.option("--primary-key", help="Comma-separated key columns (an upsert table).")
@click.option("--schema", default="", help="Column DDL, e.g. 'user_id BIGINT, amount BIGINT'.")
@click.pass_context
def emit_declare_table(ctx: click.Context, name: str, kind: str, primary_key: str | None, schema: str) -> None:
    """Declare a root or intermediate table."""
    send(ctx.obj, DeclareTable(ctx.meta["request_id"], name, kind, split_csv(primary_key), schema), ctx.meta["timeout"])


@emit_group.command("register-job")
@click.argument("job_id")
@click.option("--sink", required=True, help="The one table this job writes.")
@click.option("--sources", help="Comma-separated tables it reads (intermediate jobs).")
@click.option("--topics", help="Comma-separated external Kafka topics it reads (root jobs).")
@click.option("--sql", default="", help="The job's query, for the record.")
@click.pass_context
def emit_register_job(ctx: click.Context, job_id: str, sink: str, sources: str | None, topics: str | None, sql: str) -> None:
    """Register the job that writes a table."""
    command = RegisterJob(ctx.meta["request_id"], job_id, sink, split_csv(sources), split_csv(topics), sql)
    send(ctx.obj, command, ctx.meta["timeout"])


@emit_group.command("deregister-job")
@click.argument("job_id")
@click.option("--status", type=click.Choice(["FINISHED", "FAILED", "CANCELED"]), required=True)
@click.option("--reason", default="")
@click.pass_context
def emit_deregister_job(ctx: click.Context, job_id: str, status: str, reason: str) -> None:
    """Record that a job ended."""
    send(ctx.obj, DeregisterJob(ctx.meta["request_id"], job_id, status, reason), ctx.meta["timeout"])


@emit_group.command("acquire-lease")
@click.argument("lease_id")
@click.option("--holder", required=True)
@click.option("--tables", required=True, help="Comma-separated tables.")
@click.option("--barrier", type=int, required=True, help="The exact point whose versions to hold.")
@click.option("--ttl-ms", type=int, default=60_000, show_default=True)
@click.pass_context
def emit_acquire_lease(ctx: click.Context, lease_id: str, holder: str, tables: str, barrier: int, ttl_ms: int) -> None:
    """Hold table versions at a barrier against VACUUM (the same id renews)."""
    command = AcquireLease(ctx.meta["request_id"], lease_id, holder, split_csv(tables), barrier, ttl_ms)
    send(ctx.obj, command, ctx.meta["timeout"])


@emit_group.command("release-lease")
@click.argument("lease_id")
@click.pass_context
def emit_release_lease(ctx: click.Context, lease_id: str) -> None:
    """Release a lease."""
    send(ctx.obj, ReleaseLease(ctx.meta["request_id"], lease_id), ctx.meta["timeout"])


@emit_group.command("request-revision")
@click.argument("table")
@click.option("--to-barrier", type=int, required=True)
@click.option("--full", is_flag=True, help="Recompute from scratch.")
@click.option("--expected-generation", type=int, default=None, help="Reject if the table moved on.")
@click.pass_context
def emit_request_revision(ctx: click.Context, table: str, to_barrier: int, full: bool, expected_generation: int | None) -> None:
    """Revise a table and its downstream closure back to a barrier."""
    command = RequestRevision(ctx.meta["request_id"], table, to_barrier, full, expected_generation)
    send(ctx.obj, command, ctx.meta["timeout"])


@emit_group.command("drop-table")
@click.argument("name")
@click.option("--reason", default="", help="Why, for the record.")
@click.pass_context
def emit_drop_table(ctx: click.Context, name: str, reason: str) -> None:
    """Remove a table that never committed a barrier (its Delta files are not touched)."""
    send(ctx.obj, DropTable(ctx.meta["request_id"], name, reason), ctx.meta["timeout"])


cli.add_command(emit_group, name="emit")


def fetch(settings: Settings, path: str) -> Any:
    try:
        return get_json(settings, path)
    except Unreachable as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


@cli.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json", "dot"]), default="table", show_default=True)
@click.pass_obj
def topology(settings: Settings, fmt: str) -> None:
    """Tables, jobs and their edges, from the running coordinator."""
    body = fetch(settings, "/topology")
    if fmt == "json":
        click.echo(json.dumps(body, indent=2, sort_keys=True))
    elif fmt == "dot":
        click.echo("digraph lockstep {")
        for name, t in body["tables"].items():
            click.echo(f'  "{name}" [shape={"box" if t["kind"] == "root" else "ellipse"}];')
        for job, j in body["jobs"].items():
            for source in j["sources"]:
                click.echo(f'  "{source}" -> "{j["sink"]}" [label="{job}"];')
            for topic in j["external_topics"]:
                click.echo(f'  "kafka:{topic}" -> "{j["sink"]}" [label="{job}"];')
        click.echo("}")
    else:
        table = Table("table", "kind", "writer", "generation", "reads")
        reads: dict[str, list[str]] = {}
        for j in body["jobs"].values():
            if j["status"] == "RUNNING":
                reads[j["sink"]] = j["sources"] + [f"kafka:{t}" for t in j["external_topics"]]
        for name, t in body["tables"].items():
            table.add_row(name, t["kind"], t["writer"] or "-", str(t["generation"]), ", ".join(reads.get(name, [])))
        Console().print(table)
        if body.get("pending"):
            click.echo(f"being created (CREATE TABLE AS SELECT, no barrier committed yet): {', '.join(body['pending'])}")


@cli.command()
@click.option("--last", default=100, show_default=True, type=click.IntRange(1), help="Barriers the percentiles cover.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_obj
def delays(settings: Settings, last: int, fmt: str) -> None:
    """How late each table and job is: latest exact barrier, lag, E2E delay p50/p99, own delay per job.

    The bottleneck (the job with the largest own delay upstream of the slowest table) is marked.
    """
    body = fetch(settings, f"/delays?last={last}")
    if fmt == "json":
        click.echo(json.dumps(body, indent=2, sort_keys=True))
        return

    for table in delay_tables(body, f"last {last} barriers"):
        Console().print(table)


@cli.group()
def barriers() -> None:
    """Inspect barriers."""


@barriers.command("tail")
@click.option("--from-beginning", is_flag=True, help="Start with the first barrier instead of new ones.")
@click.option("--count", type=int, default=None, help="Stop after this many barriers.")
@click.pass_obj
def barriers_tail(settings: Settings, from_beginning: bool, count: int | None) -> None:
    """Print barriers as they are announced: id, time, cut (Ctrl-C stops)."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

    from coordinator.client.topics import Topics
    from coordinator.codec import DecodeError, default_codec

    codec = default_codec()
    consumer = Consumer(settings.kafka_config(**{"group.id": "lockstep-tail", "enable.auto.commit": False, "log_level": 3}))
    start = OFFSET_BEGINNING if from_beginning else OFFSET_END
    consumer.assign([TopicPartition(Topics(settings.topic_prefix).barriers, 0, start)])
    seen = 0
    try:
        while count is None or seen < count:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None or msg.value() is None:
                continue
            try:
                b = codec.decode(msg.value())
            except DecodeError as exc:
                click.echo(f"(skipped undecodable record at offset {msg.offset()}: {exc})", err=True)
                continue
            when = datetime.fromtimestamp(b.ts_ms / 1000, UTC).isoformat(timespec="milliseconds")
            cut = ", ".join(f"{c.topic}[{c.partition}]={c.offset}" for c in b.cut) or "no external topics"
            click.echo(f"barrier {b.barrier}  {when}  {cut}")
            seen += 1
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


@cli.command("replay")
@click.option("--verify", is_flag=True, help="Compare with the live coordinator's /state; exit 1 on any difference.")
@click.pass_obj
def replay_command(settings: Settings, verify: bool) -> None:
    """Rebuild the state from the state topics with the same fold and print its hash."""
    from coordinator.replay import replay

    try:
        result = replay(settings, verify=verify)
    except Unreachable as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    s = result.stats
    click.echo(f"replayed {s.events_folded} events ({s.decode_errors} undecodable skipped) state hash {result.state_hash}")
    if verify:
        if result.verified:
            click.echo(f"verified: identical to the live coordinator ({result.live_hash})")
        else:
            click.echo(f"MISMATCH: live coordinator has {result.live_hash}", err=True)
            for line in result.differences:
                click.echo(f"  {line}", err=True)
            sys.exit(1)


# -- pipelines --------------------------------------------------------------------------------------


def load_or_exit(path: str) -> Any:
    from spark_jobs.pipeline import PipelineError, load_pipeline

    try:
        return load_pipeline(Path(path))
    except PipelineError as exc:
        click.echo(f"error: {path}: {exc}", err=True)
        sys.exit(1)


@cli.command()
@click.argument("pipeline_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--job", "jobs", multiple=True, help="Run only this job (job id or sink table); repeatable.")
@click.option("--max-restarts", type=click.IntRange(0), default=None,
              help="Give a failing job up after this many restarts and record it FAILED (default: never).")
@click.pass_obj
def run(settings: Settings, pipeline_file: str, jobs: tuple[str, ...], max_restarts: int | None) -> None:
    """Register a pipeline's tables and jobs with the coordinator, then run its jobs.

    Any rejection is printed and nothing starts. Each job is its own streaming query with
    its own checkpoint under $LOCKSTEP_HOME/checkpoints; a job that fails is reported and
    restarted with a growing backoff while the others carry on. Ctrl-C stops them all.

    A table made by CREATE TABLE AS SELECT appears (to readers and `lockstep topology`) once its
    first barrier is committed; if its job ends before that, the table and its files are removed.
    Running a pipeline again with a changed query is accepted: new barriers use it, and
    `lockstep revise TABLE --to-barrier B` recomputes the barriers after B with it.
    """
    from coordinator.domain.errors import Rejected
    from spark_jobs.runner import Supervisor, register_pipeline
    from spark_jobs.session import build_session

    pipeline = load_or_exit(pipeline_file)
    known = {j.job_id for j in pipeline.jobs} | {j.sink for j in pipeline.jobs}
    unknown = [j for j in jobs if j not in known]
    if unknown:
        raise click.UsageError(f"no job or table {', '.join(unknown)} in {pipeline_file}; known: {', '.join(sorted(known))}")
    try:
        registered = register_pipeline(settings, pipeline)
    except Rejected as exc:
        click.echo(f"rejected: {exc}; nothing was started", err=True)
        sys.exit(1)
    except Unreachable as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    for table in sorted({t.name for t in pipeline.derived} - {t.name for t in registered.derived}):
        click.echo(f"table {table} exists already: its CREATE TABLE IF NOT EXISTS does nothing", err=True)
    spark = build_session(f"lockstep-{Path(pipeline_file).stem}", settings=settings)
    supervisor = Supervisor(spark, registered, settings, jobs, report=lambda message: click.echo(message, err=True),
                            follow_status=True, max_restarts=max_restarts)
    supervisor.start()
    click.echo(f"running {len(supervisor.queries)} job(s): {', '.join(supervisor.queries)} (Ctrl-C stops)")
    try:
        supervisor.run(threading.Event())
        click.echo("every job ended (lockstep stop); exiting")
    except KeyboardInterrupt:
        click.echo("stopping ...")
    finally:
        supervisor.stop()


@cli.command("stop")
@click.argument("job")
@click.option("--cancel", is_flag=True, help="Stop at once (CANCELED) instead of after the barrier in progress (FINISHED).")
@click.option("--reason", default=None, help="Why, recorded with the status (default: who stopped it and when).")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the coordinator's outcome.")
@click.pass_obj
def stop_job(settings: Settings, job: str, cancel: bool, reason: str | None, timeout: float) -> None:
    """End a running job. JOB is a job id or the table it writes.

    The coordinator records the job FINISHED (or CANCELED with --cancel); the `lockstep run`
    process running it stops it within about a second (FINISHED: once the barrier in progress
    is committed) and does not restart it. The job no longer holds barriers back, `lockstep
    delays` and the lineage tables show its status, and its table keeps the exact points it
    has. Running the pipeline again (`lockstep run`) continues the table from its newest
    exact point.

    Exit 0 recorded, 1 rejected (unknown job, already ended), 2 coordinator unreachable.
    """
    topology_now = fetch(settings, "/topology")
    if job not in topology_now["jobs"]:  # a table: its running writer (a CTAS table may still be pending)
        job = next((j for j, v in topology_now["jobs"].items() if v["sink"] == job and v["status"] == "RUNNING"), job)
    status = "CANCELED" if cancel else "FINISHED"
    if reason is None:
        reason = f"lockstep stop by {getpass.getuser()}@{socket.gethostname()} at {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC"
    send(settings, DeregisterJob(new_request_id(), job, status, reason), timeout)
    click.echo(f"job {job} recorded {status}; the process running it stops it "
               + ("now" if cancel else "after the barrier in progress"))


@cli.command("revise")
@click.argument("table")
@click.option("--to-barrier", "barrier", type=click.IntRange(0), default=None,
              help="Keep the exact points up to this barrier; recompute everything after it.")
@click.option("--full", is_flag=True, help="Empty the tables and recompute them from the start of their input.")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the coordinator's outcome.")
@click.pass_obj
def revise(settings: Settings, table: str, barrier: int | None, full: bool, timeout: float) -> None:
    """Recompute TABLE and every table downstream of it from a barrier, while the pipeline runs.

    Use it when a table's data went wrong: after fixing a job's query (edit the pipeline file and
    run `lockstep run` again), or to re-ingest a root table from its Kafka topic. Each table in
    the closure gets a new generation: its exact points after the barrier stop counting at once
    (consistent reads fall back to the barrier), a root table is put back to its exact point at
    the barrier and re-reads its topic from that barrier's cut, derived tables are recomputed
    from their sources; the jobs running them switch over by themselves. Tables outside the
    closure are not touched.

    Exit 0 accepted, 1 rejected (unknown table, no exact point at that barrier), 2 unreachable.
    """
    if (barrier is None) == (not full):
        raise click.UsageError("give --to-barrier B or --full (one of them)")
    outcome = send(settings, RequestRevision(new_request_id(), table, 0 if full else barrier, full), timeout)
    closure = [k.partition(":")[2] for k in outcome.keys if k.startswith("table:")]
    start = "from scratch" if full else f"from barrier {barrier}"
    click.echo(f"revising {', '.join(closure)} {start}; their running jobs switch to the new generation")


@cli.command()
@click.argument("pipeline_file", type=click.Path(exists=True, dir_okay=False))
def explain(pipeline_file: str) -> None:
    """Print, per job, how it maintains its table and why."""
    from spark_jobs.runner import explain_job

    pipeline = load_or_exit(pipeline_file)
    for job in pipeline.jobs:
        click.echo(f"{job.job_id} -> {job.sink}: {explain_job(pipeline, job)}")


def parse_when(value: str) -> int:
    """Epoch milliseconds, or an ISO-8601 time (UTC unless it says otherwise)."""
    if value.isdigit():
        return int(value)
    try:
        when = datetime.fromisoformat(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is neither epoch milliseconds nor an ISO-8601 time") from exc
    return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp() * 1000)


@cli.command()
@click.argument("sql")
@click.option("--consistency", type=click.Choice(["read-committed", "repeatable-read", "read-uncommitted"]),
              default="read-committed", show_default=True, help="Read level (see README / DESIGN.md).")
@click.option("--as-of-barrier", type=click.IntRange(1), help="Read every table at this barrier's exact point.")
@click.option("--as-of-timestamp", help="Read at the newest barrier announced at or before this time "
              "(epoch ms or ISO-8601, e.g. 2026-11-21T20:00:00).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1), help="At most this many rows.")
@click.pass_obj
def query(settings: Settings, sql: str, consistency: str, as_of_barrier: int | None, as_of_timestamp: str | None,
          fmt: str, limit: int) -> None:
    """Run SQL over the tables at one consistent barrier.

    The result goes to stdout; the barrier and the version of each table read go to stderr.
    Exit 0 on success, 1 if the read is not possible (unknown table, no exact point, bad SQL),
    2 if the coordinator is unreachable.

    \b
    lockstep query "SELECT * FROM user_item_amount ORDER BY total_amount DESC LIMIT 5"
    lockstep query "SELECT COUNT(*) FROM shopping" --as-of-barrier 120 --format csv
    """
    from sqlglot.errors import ParseError

    from spark_jobs.lineage import register_lineage_views
    from spark_jobs.reads import CoordinatorUnreachable, SnapshotError, referenced_tables
    from spark_jobs.session import build_session

    if as_of_barrier is not None and as_of_timestamp is not None:
        raise click.UsageError("give --as-of-barrier or --as-of-timestamp, not both")
    try:
        tables = referenced_tables(sql)
    except ParseError as exc:
        click.echo(f"error: the SQL does not parse: {exc}", err=True)
        sys.exit(1)
    exit_if_unknown(tables, fetch(settings, "/topology")["tables"] if tables else {})
    spark = build_session("lockstep-query", settings=settings)
    try:
        if not tables:  # only lineage tables: nothing to pin to a barrier
            register_lineage_views(spark, settings)
            frame = spark.sql(sql)
            columns, rows = frame.columns, [tuple(r) for r in frame.limit(limit).collect()]
        else:
            columns, rows = _snapshot_query(spark, settings, sql, tables, consistency, as_of_barrier,
                                            parse_when(as_of_timestamp) if as_of_timestamp else None, limit)
    except SnapshotError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2 if isinstance(exc, CoordinatorUnreachable) else 1)
    except Exception as exc:  # noqa: BLE001 - Spark analysis errors (unknown column, ...) are the user's to fix
        click.echo(f"error: {str(exc).splitlines()[0]}", err=True)
        sys.exit(1)
    _print_rows(columns, rows, fmt)


@cli.command("vacuum")
@click.argument("tables", nargs=-1)
@click.option("--dry-run", is_flag=True, help="List the files that would go and why the rest stays; delete nothing.")
@click.option("--retain-barriers", type=click.IntRange(0), default=None,
              help="Also keep the exact points of this many newest barriers "
                   "(default: LOCKSTEP_RETAIN_BARRIERS, else 100; 0 keeps only what someone needs now).")
@click.option("--list-files", "show_files", default=20, show_default=True, type=click.IntRange(0),
              help="Print at most this many file names per table.")
@click.pass_obj
def vacuum_command(settings: Settings, tables: tuple[str, ...], dry_run: bool, retain_barriers: int | None,
                   show_files: int) -> None:
    """Delete old Delta files of TABLES (default: every table) that nobody needs any more.

    A version stays readable while a repeatable-read lease holds it, a running job reads from
    it next, it is a table's newest exact point or the one read-committed readers pick now, or
    it is the exact point of one of the newest --retain-barriers barriers. Older versions'
    files go; reading them afterwards fails with a clear "vacuumed" error.

    Exit 0 done, 1 unknown table, 2 the broker (where the coordinator's state lives) unreachable.
    """
    from coordinator.client.state import read_state
    from spark_jobs.session import build_session
    from spark_jobs.vacuum import vacuum

    try:
        state = read_state(settings)
    except Exception as exc:  # noqa: BLE001 - Kafka errors come in many types; all mean the same here
        click.echo(f"error: cannot read the coordinator's state from {settings.bootstrap}: {exc}", err=True)
        sys.exit(2)
    exit_if_unknown(tables, state.tables)
    spark = build_session("lockstep-vacuum", settings=settings)
    reports = vacuum(spark, settings, tables, retain_barriers, dry_run, state=state)
    for report in reports:
        if report.floor is None:
            click.echo(f"{report.table}: no Delta table yet; nothing to vacuum")
            continue
        verb = "would delete" if dry_run else "deleted"
        click.echo(f"{report.table}: {verb} {len(report.files)} file(s); versions >= {report.floor} stay readable")
        for keep in report.keeps:
            click.echo(f"  keeps version {keep.version}: {keep.reason}")
        for name in report.files[:show_files]:
            click.echo(f"  {verb}: {name}")
        if len(report.files) > show_files:
            click.echo(f"  ... and {len(report.files) - show_files} more")


def _snapshot_query(spark: Any, settings: Settings, sql: str, tables: list[str], consistency: str,
                    as_of_barrier: int | None, as_of_timestamp: int | None, limit: int) -> tuple[list[str], list[tuple]]:
    from spark_jobs.reads import open_snapshot

    with open_snapshot(spark, tables, consistency, as_of_barrier, as_of_timestamp, settings) as snap:
        click.echo(f"barrier {snap.barrier if snap.barrier is not None else '(latest versions)'}; versions "
                   + ", ".join(f"{t}={v if v is not None else 'latest'}" for t, v in snap.versions.items()), err=True)
        frame = snap.sql(sql)
        return frame.columns, [tuple(r) for r in frame.limit(limit).collect()]


def _print_rows(columns: list[str], rows: list[tuple], fmt: str) -> None:
    import csv

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


def main() -> None:
    cli(prog_name="lockstep")


if __name__ == "__main__":
    main()
