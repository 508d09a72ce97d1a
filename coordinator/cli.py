"""The ``lockstep`` command.

Exit codes scripts can trust: 0 success, 1 the operation failed (the message says why),
2 bad usage, 3 ``dev status`` found the broker stopped.
"""

from __future__ import annotations

import sys

import click

from coordinator.dev.broker import BrokerError, BrokerStatus, LocalBroker
from coordinator.settings import Settings, SettingsError


def is_loopback(settings: Settings) -> bool:
    return settings.bootstrap_host in ("127.0.0.1", "localhost")


def local_broker(settings: Settings) -> LocalBroker:
    """The broker ``lockstep dev`` manages: ``$LOCKSTEP_HOME/kafka`` on ``LOCKSTEP_BOOTSTRAP``'s port."""
    if not is_loopback(settings):
        raise click.UsageError(
            f"LOCKSTEP_BOOTSTRAP={settings.bootstrap} is not on 127.0.0.1; the local broker only "
            "runs on loopback. Unset it or use 127.0.0.1:<port>."
        )
    return LocalBroker(home=settings.home / "kafka", jars=settings.jars / "kafka", port=settings.bootstrap_port)


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
@click.option("--records", default=5000, show_default=True, type=click.IntRange(1), help="Records to produce.")
@click.pass_obj
def demo(settings: Settings, records: int) -> None:
    """End-to-end smoke: broker -> Kafka topic -> Spark -> Delta -> read back, with counts.

    With a loopback LOCKSTEP_BOOTSTRAP it starts the local broker if it is not running and
    stops it afterwards (only if this command started it); otherwise it uses that cluster.
    Exit 0 only if every produced record arrived in Delta.
    """
    from spark_jobs.smoke import run_smoke

    broker = local_broker(settings) if is_loopback(settings) else None
    started_here = broker is not None and broker.running_pid() is None
    try:
        if broker is None:
            click.echo(f"using the Kafka cluster at {settings.bootstrap}")
        else:
            click.echo(("starting " if started_here else "reusing ") + f"local broker on {broker.bootstrap} ...")
            broker.up()
        result = run_smoke(settings, records=records, echo=click.echo)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        if broker is not None and started_here:
            broker.down()
            click.echo("stopped the broker this demo started")
    click.echo(
        f"produced {result.produced} records (amount {result.produced_amount}); "
        f"Delta table {result.table_path} v{result.delta_version} holds {result.delta_rows} rows "
        f"(amount {result.delta_amount}) in {result.seconds:.1f}s"
    )
    if not result.ok:
        raise click.ClickException("the Delta table does not hold exactly the produced records")
    click.echo("smoke OK")


def main() -> None:
    cli(prog_name="lockstep")


if __name__ == "__main__":
    main()
