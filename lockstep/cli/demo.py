"""``lockstep demo`` (FLIP-276's pipeline, live) and ``lockstep datagen`` (its input)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from coordinator.domain.errors import ExitCode, LockstepError, Unreachable
from coordinator.domain.snapshot import ReadLevel
from coordinator.settings import Settings
from lockstep.cli.common import delay_tables, stop_signals

if TYPE_CHECKING:
    from spark_jobs.demo.datagen import RecordMaker


@click.command()
@click.option("--seconds", default=60.0, show_default=True, type=click.FloatRange(min=1), help="How long to read.")
@click.option("--warmup", default=30.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds of purchases and reads first, not counted (the JVMs compile their hot code).")
@click.option("--rate", default=1000, show_default=True, type=click.IntRange(1), help="Purchases per second generated.")
@click.option("--users", default=100, show_default=True, type=click.IntRange(1), help="Distinct users.")
@click.option("--items", default=20, show_default=True, type=click.IntRange(1), help="Distinct items.")
@click.option("--pipeline", "pipeline_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="The pipeline to run (default: pipelines/shopping.sql).")
@click.option("--reader", type=click.Choice(["light", "spark", "serve"]), default="light", show_default=True,
              help="How the demo reads: light (delta-rs and DataFusion in the demo's process, no JVM), "
                   "spark (a Spark session of its own, to compare) or serve (psycopg through lockstep serve)")
@click.pass_context
def demo(ctx: click.Context, seconds: float, warmup: float, rate: int, users: int, items: int,
         pipeline_file: Path | None, reader: str) -> None:
    """FLIP-276's shopping pipeline, live, read at every level.

    Starts (or reuses) the local broker and a coordinator worker, runs pipelines/shopping.sql
    (shopping -> user_item_amount = SUM(amount), user_item_price = SUM(price)), generates
    purchases in which every item has a fixed unit price, and runs FLIP-276's join of the two
    tables again and again at each read level. A row whose average price total_price /
    total_amount is not the unit price is an anomaly: numbers that never existed. The view
    shows reads, anomalies and staleness per level; at the end, a summary and the E2E delays.

    Exit 0 only if read-committed and repeatable-read each read and saw zero anomalies; 1 if
    they saw any (or never got to read); 4 if a part could not start; 130 on Ctrl-C. Whatever
    the demo started, it stops.
    """
    from lockstep.demo import SHOPPING, DemoOptions, level_table, run_demo

    console = Console(width=None if sys.stdout.isatty() else 120)
    options = DemoOptions(seconds=seconds, warmup=warmup, rate=rate, users=users, items=items,
                          pipeline=pipeline_file or SHOPPING, reader=reader)
    result = run_demo(ctx.obj, options, say=lambda line: console.print(line, markup=False, highlight=False),
                      console=console)
    console.print(level_table(result.stats, title=f"summary: {result.seconds:.0f} s, {result.purchases:,} purchases"))
    for table in delay_tables(result.delays, "this run's barriers") if result.delays else ():
        console.print(table)
    rc, rr, ru = (result.stats[level] for level in ReadLevel)
    click.echo(f"read-uncommitted: {ru.anomalous_reads} of {ru.reads} reads returned numbers that never existed "
               f"({ru.anomalous_rows} rows); allowed at that level")
    if result.interrupted:
        ctx.exit(ExitCode.INTERRUPTED)
    if not result.ok:
        raise LockstepError(f"read-committed {rc.anomalous_reads} of {rc.reads} reads and repeatable-read "
                            f"{rr.anomalous_reads} of {rr.reads} reads had anomalies (both must read and see none)")
    click.echo(f"OK: read-committed ({rc.reads} reads) and repeatable-read ({rr.reads} reads) saw zero anomalies")


@click.group()
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
    be delivered, 3 if Kafka does not answer, 130 after Ctrl-C, 143 after SIGTERM.

    \b
    lockstep datagen shopping --rate 10000 --seconds 60
    """
    from spark_jobs.demo.datagen import purchases

    _generate(settings, [topic], partitions, rate, purchases(users, items), seed, seconds, "purchases")


@datagen.command("lines")
@click.argument("topic")
@click.option("--key", "key_field", metavar="FIELD", help="Use this field of each record as its Kafka key (default: no key).")
@click.option("--partitions", default=2, show_default=True, type=click.IntRange(1), help="Partitions if the topic is new.")
@click.pass_obj
def datagen_lines(settings: Settings, topic: str, key_field: str | None, partitions: int) -> None:
    """Send the JSON objects on stdin, one per line, to TOPIC (created if new).

    For trying your own pipeline: a root table with 'format' = 'json' reads each record's fields
    as its columns. Every line is checked before anything is sent: a line that is not a JSON
    object (or lacks the --key field) stops it with exit 2, naming the line. Exit 1 if Kafka did
    not take every record, 3 if it does not answer.

    \b
    printf '%s\n' '{"user": "ann", "page": "/home", "ms": 120}' | lockstep datagen lines clicks
    lockstep datagen lines clicks --key user < clicks.jsonl
    """
    from spark_jobs.demo.datagen import parse_lines, send_lines

    records = parse_lines(click.get_text_stream("stdin"), key_field)
    sent = send_lines(settings, topic, records, partitions)
    click.echo(f"sent {sent} records to {topic}")


@datagen.command("nexmark")
@click.option("--rate", default=1000, show_default=True, type=click.IntRange(1), help="Events per second.")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), help="Stop after this long (default: until Ctrl-C).")
@click.option("--prefix", default="nexmark", show_default=True,
              help="Topics PREFIX_person, PREFIX_auction, PREFIX_bid (those pipelines/nexmark.sql reads).")
@click.option("--partitions", default=2, show_default=True, type=click.IntRange(1), help="Partitions if a topic is new.")
@click.option("--seed", default=7, show_default=True, type=int, help="Random seed (same seed, same events).")
@click.pass_obj
def datagen_nexmark(settings: Settings, rate: int, seconds: float | None, prefix: str, partitions: int, seed: int) -> None:
    """Produce Nexmark's people, auctions and bids (1 : 3 : 46) at a steady rate, as JSON.

    Bids name auctions and people made before them, auctions their seller; every event's
    date_time is its produce time. Creates the topics if needed, reports progress every 5 s,
    and on Ctrl-C or SIGTERM flushes and stops (exit codes as `datagen shopping`).

    \b
    lockstep datagen nexmark --rate 5000 --seconds 60
    """
    from spark_jobs.demo.nexmark import nexmark_events, topics

    _generate(settings, list(topics(prefix).values()), partitions, rate, nexmark_events(prefix), seed, seconds, "events")


def _generate(settings: Settings, names: list[str], partitions: int, rate: int, make: RecordMaker, seed: int,
              seconds: float | None, what: str) -> None:
    """Create the topics if needed, then produce ``make``'s records at ``rate`` until stopped."""
    from confluent_kafka import KafkaException

    from spark_jobs.demo.datagen import RateGenerator, ensure_topic

    with stop_signals() as stopping:
        try:
            for topic in names:
                if ensure_topic(settings, topic, partitions):
                    click.echo(f"created topic {topic} ({partitions} partitions)")
            generator = RateGenerator(settings, names[0], rate, make, seed)
        except KafkaException as exc:
            raise Unreachable(f"Kafka at {settings.bootstrap}: {exc}") from exc
        click.echo(f"producing {rate:,} {what}/s to {', '.join(names)} on {settings.bootstrap} (Ctrl-C stops)")
        sent = generator.run(stopping.event, seconds, progress=click.echo)
        click.echo(f"sent {sent:,} {what}; {generator.failed} not delivered")
        if generator.failed:
            raise LockstepError(f"{generator.failed} {what} were not delivered to {', '.join(names)}")
        stopping.check()  # flushed; 130 after Ctrl-C, 143 after SIGTERM, as everywhere
