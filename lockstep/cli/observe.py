"""Looking at the running coordinator: ``status``, ``topology``, ``delays``, ``barriers tail``, ``replay``."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click
from rich.console import Console
from rich.table import Table

from coordinator.client.rest import get_json
from coordinator.domain.errors import LockstepError
from coordinator.domain.events import END_STATUSES, NO_PARTITIONS, CutEntry, JobStatus, TableKind
from coordinator.domain.starts import describe
from coordinator.settings import Settings
from lockstep.cli.common import delay_tables, echo_json, format_option


@click.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json", "dot"]), default="table", show_default=True,
              help="table for people, json for scripts, dot for Graphviz")
@click.pass_obj
def topology(settings: Settings, fmt: str) -> None:
    """Tables, jobs and their edges, from the running coordinator."""
    body = get_json(settings, "/topology")
    if fmt == "json":
        click.echo(json.dumps(body, indent=2, sort_keys=True))
    elif fmt == "dot":
        click.echo("digraph lockstep {")
        for name, t in body["tables"].items():
            click.echo(f'  "{name}" [shape={"box" if t["kind"] == TableKind.ROOT else "ellipse"}];')
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
            if j["status"] not in END_STATUSES:
                reads[j["sink"]] = j["sources"] + [f"kafka:{t}" for t in j["external_topics"]]
        stalled = sorted(job for job, j in body["jobs"].items() if j["status"] == JobStatus.STALLED)
        for name, t in body["tables"].items():
            table.add_row(name, t["kind"], t["writer"] or "-", str(t["generation"]), ", ".join(reads.get(name, [])))
        Console().print(table)
        if stalled:
            click.echo(f"stalled (RUNNING, but no commit within LOCKSTEP_JOB_LIVENESS_MS; is its process alive?): "
                       f"{', '.join(stalled)}")
        if body.get("pending"):
            click.echo(f"being created (CREATE TABLE AS SELECT, no barrier committed yet): {', '.join(body['pending'])}")


@click.command()
@format_option()
@click.pass_obj
def status(settings: Settings, fmt: str) -> None:
    """The pipeline at a glance, from the running coordinator: each table's writer and its status,
    generation, newest exact point and lag in barriers, which barriers it commits (a table far
    slower than the rest commits every k-th one, and why), and where each root table started
    reading its topics (its 'start' rule and the offsets that resolved to when it was declared)."""
    shape, delays_now = get_json(settings, "/topology"), get_json(settings, "/delays")
    rows = []
    for name, t in shape["tables"].items():
        figures = delays_now["tables"].get(name, {})
        writer = t["writer"]
        offsets = [CutEntry(*entry) for entry in t.get("start_offsets", [])]
        rows.append({"table": name, "kind": t["kind"], "table_id": t.get("table_id", ""), "writer": writer,
                     "status": shape["jobs"][writer]["status"] if writer in shape["jobs"] else None,
                     "generation": t["generation"], "latest_exact_barrier": figures.get("latest_exact_barrier"),
                     "lag_barriers": figures.get("lag_barriers"), "stride": t.get("stride"), "start": t.get("start"),
                     "started_at": describe(t["start"], offsets) if "start" in t else None})
    if fmt == "json":
        echo_json({"tables": rows, "pending": shape.get("pending", [])})
        return
    table = Table("table", "kind", "writer", "status", "generation", "newest exact barrier", "lag", "commits")
    for row in rows:
        lag, stride = row["lag_barriers"], row["stride"]
        table.add_row(row["table"], row["kind"], row["writer"] or "-", row["status"] or "-", str(row["generation"]),
                      str(row["latest_exact_barrier"] or "-"), "-" if lag is None else str(lag),
                      "every barrier" if stride is None else f"every {stride['every']} barriers")
    Console().print(table)
    for row in rows:
        if (stride := row["stride"]) is not None:
            click.echo(f"{row['table']} commits every {stride['every']} barriers: its commit takes "
                       f"{stride['cost_ms'] / 1000:.1f} s, {stride['cost_ms'] / stride['reference_ms']:.1f}x the "
                       f"{stride['reference_ms'] / 1000:.1f} s the clock keeps without it (LOCKSTEP_BARRIER_STRIDE_AFTER)")
    for row in rows:
        if row["started_at"] is not None:
            click.echo(f"{row['table']} started reading at {row['started_at']}")
    if shape.get("pending"):
        click.echo(f"being created (CREATE TABLE AS SELECT, no barrier committed yet): {', '.join(shape['pending'])}")


@click.command()
@click.option("--last", default=100, show_default=True, type=click.IntRange(1), help="Barriers the percentiles cover.")
@format_option()
@click.pass_obj
def delays(settings: Settings, last: int, fmt: str) -> None:
    """How late each table and job is: latest exact barrier, lag, E2E delay p50/p99, own delay per job.

    The bottleneck (the job with the largest own delay upstream of the slowest table) is marked.
    """
    body = get_json(settings, f"/delays?last={last}")
    if fmt == "json":
        click.echo(json.dumps(body, indent=2, sort_keys=True))
        return

    for table in delay_tables(body, f"last {last} barriers"):
        Console().print(table)


@click.group()
def barriers() -> None:
    """Inspect barriers."""


@barriers.command("tail")
@click.option("--from-beginning", is_flag=True, help="Start with the first barrier instead of new ones.")
@click.option("--count", type=int, default=None, help="Stop after this many barriers.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="a line per barrier for people, or a JSON object per line (JSON Lines) for scripts")
@click.pass_obj
def barriers_tail(settings: Settings, from_beginning: bool, count: int | None, fmt: str) -> None:
    """Print barriers as they are announced: id, time, cut (Ctrl-C stops, exit 130)."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

    from coordinator.client.topics import TAIL_GROUP, Topics
    from coordinator.codec import DecodeError, default_codec

    codec = default_codec(settings.schemas)
    consumer = Consumer(settings.kafka_config({"group.id": settings.topic_prefix + TAIL_GROUP, "enable.auto.commit": False,
                                               "log_level": 3}))
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
            if fmt == "json":
                click.echo(json.dumps({"barrier": b.barrier, "ts_ms": b.ts_ms, "time": when,
                                       "cut": [{"topic": c.topic, "partition": c.partition, "offset": c.offset} for c in b.cut]}))
            else:
                cut = ", ".join(f"{c.topic}[{c.partition}]={c.offset}" if c.partition != NO_PARTITIONS
                                else f"{c.topic} (did not exist yet)" for c in b.cut) or "no external topics"
                click.echo(f"barrier {b.barrier}  {when}  {cut}")
            seen += 1
    finally:
        consumer.close()


@click.command("replay")
@click.option("--verify", is_flag=True, help="Compare with the live coordinator's /state; exit 1 on any difference.")
@format_option()
@click.pass_obj
def replay_command(settings: Settings, verify: bool, fmt: str) -> None:
    """Rebuild the state from the state topics with the same fold and print its hash."""
    from coordinator.replay import replay

    result = replay(settings, verify=verify)
    s = result.stats
    if fmt == "json":
        echo_json({"events_folded": s.events_folded, "decode_errors": s.decode_errors, "state_hash": result.state_hash,
                   "verified": result.verified if verify else None, "live_hash": result.live_hash if verify else None,
                   "differences": list(result.differences) if verify else []})
        if verify and not result.verified:
            raise LockstepError(f"MISMATCH: live coordinator has {result.live_hash}")
        return
    click.echo(f"replayed {s.events_folded} events ({s.decode_errors} undecodable skipped) state hash {result.state_hash}")
    if verify:
        if result.verified:
            click.echo(f"verified: identical to the live coordinator ({result.live_hash})")
        else:
            differences = "".join(f"\n  {line}" for line in result.differences)
            raise LockstepError(f"MISMATCH: live coordinator has {result.live_hash}{differences}")
