"""The root group: settings for every command, and the one place errors become exit codes.

Commands raise ``LockstepError`` (see ``coordinator.domain.errors``); ``LockstepGroup`` catches
it once, prints ``"<label>: <message>"`` on stderr and exits with the error's code.
"""


from __future__ import annotations

import signal
from typing import Any

import click

from coordinator.domain.errors import ExitCode, LockstepError, Terminated
from coordinator.settings import Settings
from lockstep import signals
from lockstep.cli.demo import datagen, demo
from lockstep.cli.dev import acls, dev, worker
from lockstep.cli.emit import emit_group
from lockstep.cli.observe import barriers, delays, replay_command, status, topology
from lockstep.cli.pipelines import drop, explain, revise, run, stop_job
from lockstep.cli.reads import query, serve, vacuum

EXIT_CODES = {
    ExitCode.OK: "success",
    ExitCode.FAILED: "the operation failed or a command was rejected (the message says why)",
    ExitCode.USAGE: "bad usage: a flag, a LOCKSTEP_* value or a pipeline file",
    ExitCode.UNREACHABLE: "the broker or the coordinator does not answer (dev status: the broker is stopped)",
    ExitCode.NOT_STARTED: "a part Lockstep starts itself (local broker, worker, Spark) could not start",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
    ExitCode.TERMINATED: "stopped cleanly after SIGTERM (kill PID, systemd, Kubernetes)",
}
# commands that never reach Kafka (acls only with --apply, and then checks): a malformed
# LOCKSTEP_BOOTSTRAP or LOCKSTEP_KAFKA_* must not stop them; every other command is refused at once
WITHOUT_KAFKA = frozenset(command.name for command in (explain, acls, topology, delays))
ASKS_HELP = "lockstep.asks_help"  # (ctx.meta) a subcommand's --help: nothing of Kafka is needed


class LockstepGroup(click.Group):
    """The root group: the one place where errors become messages and exit codes."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """Also note whether the rest of the line asks for help, which needs no Kafka settings."""
        rest = args[1:args.index("--")] if "--" in args else args[1:]
        ctx.meta[ASKS_HELP] = any(a in ctx.help_option_names for a in rest)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LockstepError as exc:
            click.echo(f"{exc.label}: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except (Terminated, KeyboardInterrupt, SystemError) as exc:
            # a SystemError may be a signal's exception raised inside a C extension's callback
            # (lockstep.signals); after Ctrl-C or SIGTERM the command was stopped all the same
            signum = signals.stopped_as(exc)
            if signum is None:
                raise
            terminated = signum == signal.SIGTERM
            click.echo("terminated" if terminated else "interrupted", err=True)
            ctx.exit(ExitCode.TERMINATED if terminated else ExitCode.INTERRUPTED)


@click.group(cls=LockstepGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="\b\nExit codes:\n" + "\n".join(f"  {code.value:<4}{what}" for code, what in EXIT_CODES.items()))
@click.version_option(package_name="lockstep-etl", prog_name="lockstep", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Lockstep: consistent streaming ETL on the lakehouse.

    Configuration comes from LOCKSTEP_* environment variables (see docs/configuration.md):
    LOCKSTEP_BOOTSTRAP, LOCKSTEP_HOME, LOCKSTEP_WAREHOUSE, LOCKSTEP_JARS,
    LOCKSTEP_COORDINATOR_URL, and LOCKSTEP_KAFKA_* for Kafka client settings.
    """
    settings = Settings.from_env(kafka=False)
    without_kafka = ctx.invoked_subcommand in WITHOUT_KAFKA or ctx.meta.get(ASKS_HELP, False)
    ctx.obj = settings if without_kafka else settings.check_kafka()


for command in (dev, worker, acls, demo, datagen, run, stop_job, revise, drop, explain, query, serve, vacuum, status,
                topology, delays, barriers, replay_command):
    cli.add_command(command)
cli.add_command(emit_group, name="emit")


def main() -> None:
    signals.install()
    cli(prog_name="lockstep")
