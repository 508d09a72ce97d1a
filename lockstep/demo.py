"""``lockstep demo``: FLIP-276's shopping pipeline running, read at every level, live.

It starts (or reuses) the local broker and a coordinator worker, registers and runs
``pipelines/shopping.sql``, runs ``lockstep datagen shopping`` as a child process, and reads
FLIP-276's join again and again at each read level (``spark_jobs.demo.probes``). Whatever it
started, it stops, also on Ctrl-C.

Example::

    result = run_demo(settings, DemoOptions(seconds=30, rate=2000), say=print)
    result.ok    # True if read-committed and repeatable-read read and saw no anomaly
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from confluent_kafka import Consumer, TopicPartition
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from coordinator.client.rest import get_json
from coordinator.client.snapshots import CoordinatorUnreachable, close_clients
from coordinator.client.topics import DEMO_GROUP
from coordinator.domain.errors import NotStarted, Unreachable
from coordinator.domain.snapshot import ReadLevel
from coordinator.settings import Settings
from lockstep import signals
from lockstep.dev.broker import LocalBroker, free_port, port_in_use, topic_count
from lockstep.dev.worker import WorkerProcess, healthy
from spark_jobs.demo.datagen import ensure_topic
from spark_jobs.demo.probes import LevelStats, Prober

SHOPPING = Path(__file__).resolve().parents[1] / "pipelines" / "shopping.sql"
CAUGHT_UP = 2  # barriers a table may lag when the demo starts generating and reading
POLL_S = 0.2  # how soon the demo reads again when the last round found no new versions


class DemoError(NotStarted):
    """The demo could not start a part it needs; the message says which and how to fix it."""


@dataclass(frozen=True)
class DemoOptions:
    seconds: float = 60.0
    warmup: float = 30.0  # seconds of purchases and reads before the measured ones (JVMs warm up)
    rate: int = 1000
    users: int = 100
    items: int = 20
    pipeline: Path = SHOPPING
    reader: str = "light"  # light: delta-rs + DataFusion in this process; spark: a Spark session; serve: lockstep serve


@dataclass
class DemoResult:
    stats: dict[str, LevelStats]
    delays: dict[str, Any] = field(default_factory=dict)
    purchases: int = 0
    seconds: float = 0.0
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        """Read-committed and repeatable-read each read at least once and never saw an anomaly."""
        consistent = [self.stats[level] for level in (ReadLevel.READ_COMMITTED, ReadLevel.REPEATABLE_READ)]
        return all(s.reads > 0 and s.anomalous_reads == 0 for s in consistent)


def level_table(stats: dict[str, LevelStats], title: str = "reads of FLIP-276's join") -> Table:
    """Per read level: reads, joins Spark ran for them, reads with anomalies, anomalous rows, staleness."""
    table = Table("level", "reads", "joins run", "reads with anomalies", "anomalous rows", "staleness p50",
                  "staleness p99", "newest barrier", title=title)
    for level, s in stats.items():
        bad = f"[red]{s.anomalous_reads}[/]" if s.anomalous_reads else "[green]0[/]"
        p50, p99 = s.staleness(0.5), s.staleness(0.99)
        table.add_row(level, str(s.reads), str(s.evaluated), bad, str(s.anomalous_rows),
                      "-" if p50 is None else f"{p50 / 1000:.2f} s", "-" if p99 is None else f"{p99 / 1000:.2f} s",
                      str(max(s.barriers)) if s.barriers else "-")
    return table


def _topic_size(consumer: Consumer, topic: str) -> int:
    metadata = consumer.list_topics(topic, timeout=5).topics.get(topic)
    if metadata is None:
        return 0
    return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5, cached=False)[1]
               for p in metadata.partitions)


@contextmanager
def _broker(settings: Settings, say: Callable[[str], None]) -> Iterator[None]:
    broker = LocalBroker.for_settings(settings)
    if broker is None or (broker.running_pid() is None and port_in_use(broker.port) and _answers(settings.bootstrap)):
        say(f"using the Kafka broker at {settings.bootstrap}")
        yield
        return
    started = broker.running_pid() is None
    say(("starting" if started else "reusing") + f" the local broker on {broker.bootstrap} ...")
    broker.up()
    try:
        yield
    finally:
        if started:
            broker.down()
            say("stopped the broker this demo started")


def _answers(bootstrap: str) -> bool:
    try:
        topic_count(bootstrap)
        return True
    except Exception:  # noqa: BLE001 - anything but an answer: not a Kafka broker we can use
        return False


def _child_env(settings: Settings) -> dict[str, str]:
    """The environment of a child that must see the demo's settings (the worker, the jobs)."""
    return {**os.environ, "LOCKSTEP_BOOTSTRAP": settings.bootstrap, "LOCKSTEP_HOME": str(settings.home),
            "LOCKSTEP_TOPIC_PREFIX": settings.topic_prefix, "LOCKSTEP_COORDINATOR_URL": settings.coordinator_url}


@contextmanager
def _coordinator(settings: Settings, say: Callable[[str], None]) -> Iterator[None]:
    url = urlparse(settings.coordinator_urls[0])
    if healthy(settings.coordinator_url):
        say(f"reusing the coordinator at {settings.coordinator_url}; live page: {settings.page_url}")
        yield
        return
    if url.hostname not in ("127.0.0.1", "localhost") or url.port is None:
        raise DemoError(f"no coordinator answers at LOCKSTEP_COORDINATOR_URL={settings.coordinator_url} and the demo only "
                        "starts one on 127.0.0.1:<port>; start it there with `lockstep worker`, or unset the variable")
    # one barrier in flight unless set: the demo's jobs are fused into one Spark pass on one machine,
    # where a second barrier only waits behind the first and adds that wait to every read's staleness
    env = {"LOCKSTEP_BARRIER_MAX_INFLIGHT": "1", **_child_env(settings)}
    worker = WorkerProcess(env, url.port, settings.home / "logs" / "worker.log")
    say(f"starting a coordinator worker on {worker.url} (log {worker.log}) ...")
    worker.start()  # WorkerError (could not start, exit 4) names its log
    say(f"live page: {settings.page_url} (tables, jobs, freshness, barriers; it updates itself)")
    try:
        yield
    finally:
        worker.stop()
        say("stopped the coordinator worker this demo started")


@contextmanager
def _generator(settings: Settings, topic: str, options: DemoOptions, say: Callable[[str], None]) -> Iterator[None]:
    log = settings.home / "logs" / "datagen.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "lockstep", "datagen", "shopping", "--rate", str(options.rate),
               "--users", str(options.users), "--items", str(options.items), "--topic", topic]
    with open(log, "ab") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, "LOCKSTEP_BOOTSTRAP": settings.bootstrap})
    say(f"generating {options.rate:,} purchases/s into {topic} (log {log})")
    try:
        yield
    finally:
        _stop(child, grace=30)


@contextmanager
def _jobs(settings: Settings, pipeline: Path, say: Callable[[str], None]) -> Iterator[subprocess.Popen[bytes]]:
    """``lockstep run PIPELINE`` as a child process: the jobs get a Spark application of their
    own, so the demo's reads (in this process's Spark) never queue behind a barrier's work."""
    log = settings.home / "logs" / "jobs.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        child = subprocess.Popen([sys.executable, "-m", "lockstep", "run", str(pipeline)], stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True, env=_child_env(settings))
    say(f"running the pipeline's jobs in their own Spark application (log {log})")
    try:
        yield child
    finally:
        _stop(child, grace=60)
        say("stopped the jobs")


@contextmanager
def _server(settings: Settings, say: Callable[[str], None], timeout: float = 60) -> Iterator[str]:
    """``lockstep serve`` as a child process on a free loopback port; yields its psycopg DSN."""
    log = settings.home / "logs" / "serve.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with open(log, "w") as out:
        child = subprocess.Popen([sys.executable, "-m", "lockstep", "serve", "--port", str(port)], stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True, env=_child_env(settings))
    try:
        deadline = time.monotonic() + timeout
        while "serving Lockstep's tables" not in log.read_text():
            if child.poll() is not None or time.monotonic() > deadline:
                raise DemoError(f"lockstep serve did not start; see {log}")
            time.sleep(0.2)
        say(f"reading through lockstep serve on 127.0.0.1:{port} (log {log})")
        yield f"host=127.0.0.1 port={port} user=lockstep dbname=lockstep"
    finally:
        _stop(child, grace=10)


def _stop(child: subprocess.Popen[bytes], grace: float) -> None:
    """Ctrl-C to ``child``; after ``grace`` seconds, kill its whole session (its Spark JVM too)."""
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(10)


def _check_running(jobs: subprocess.Popen[bytes], settings: Settings) -> None:
    """Raise DemoError if the jobs' process has exited (its log says why)."""
    if jobs.poll() is not None:
        raise DemoError(f"the pipeline's jobs exited (code {jobs.returncode}); see {settings.home / 'logs' / 'jobs.log'}")


def _wait_ready(settings: Settings, tables: list[str], jobs: subprocess.Popen[bytes], say: Callable[[str], None],
                timeout: float = 300) -> None:
    """Until every derived table has a commit of this run's jobs and is at most ``CAUGHT_UP``
    barriers behind (Spark started, tables made, the backlog of an earlier run worked off), so
    the demo's clock and the purchases start when the pipeline runs, not while it starts. (A
    table an earlier run left caught up would otherwise count as ready before Spark is.)"""
    started = time.monotonic()
    before: dict[str, int | None] | None = None  # each table's newest exact point when this began
    while time.monotonic() - started < timeout:
        _check_running(jobs, settings)
        try:
            figures = get_json(settings, "/delays")["tables"]
            if before is None:
                before = {t: figures.get(t, {}).get("latest_exact_barrier") for t in tables}
            if all(t in figures and figures[t]["latest_exact_barrier"] not in (None, before[t])
                   and figures[t]["lag_barriers"] <= CAUGHT_UP for t in tables):
                say(f"the jobs are running and caught up after {time.monotonic() - started:.0f} s")
                return
        except Unreachable:
            pass  # the worker is busy: ask again
        time.sleep(0.5)
    raise DemoError(f"the jobs made no table within {timeout:.0f} s; see {settings.home / 'logs' / 'jobs.log'}")


def run_demo(settings: Settings, options: DemoOptions, say: Callable[[str], None] = print,
             console: Console | None = None) -> DemoResult:
    """Run the demo for ``options.seconds`` (Ctrl-C ends it early; the result says so)."""
    from spark_jobs.ops.jobs import register_pipeline
    from spark_jobs.planning.pipeline import load_pipeline
    from spark_jobs.runtime.session import build_session

    console = console or Console()
    pipeline = load_pipeline(options.pipeline)
    missing = [t for t in ("user_item_amount", "user_item_price") if t not in {d.name for d in pipeline.derived}]
    if missing or len(pipeline.roots) != 1:
        raise DemoError(f"{options.pipeline} must define one root table and user_item_amount, user_item_price "
                        "(FLIP-276's shopping pipeline)")
    topic = pipeline.roots[0].topic
    result = DemoResult({level: LevelStats() for level in ReadLevel})
    started = time.monotonic()
    since_ms = int(time.time() * 1000)
    with ExitStack() as stack:
        try:
            stack.enter_context(_broker(settings, say))
            stack.enter_context(_coordinator(settings, say))
            if ensure_topic(settings, topic, partitions=2):
                say(f"created topic {topic} (2 partitions)")
            pipeline = register_pipeline(settings, pipeline)
            say(f"registered {options.pipeline.name}: " + ", ".join(f"{j.job_id} -> {j.sink}" for j in pipeline.jobs))
            jobs = stack.enter_context(_jobs(settings, options.pipeline, say))
            spark = None
            if options.reader == "spark":
                quiet = replace(settings, spark_log_level=settings.spark_log_level or "ERROR")  # a readable live view
                spark = build_session("lockstep-demo-reads", settings=quiet)  # starts while the jobs start
                stack.callback(spark.stop)
            stack.callback(close_clients)  # the leases' client, before the broker stops
            _wait_ready(settings, [d.name for d in pipeline.derived], jobs, say)
            consumer = Consumer(settings.kafka_config({"group.id": f"{settings.topic_prefix}{DEMO_GROUP}-sizes"}))
            stack.callback(consumer.close)
            before = _topic_size(consumer, topic)  # purchases of earlier runs are not this run's
            stack.enter_context(_generator(settings, topic, options, say))
            dsn = stack.enter_context(_server(settings, say)) if options.reader == "serve" else None
            prober = Prober(spark, settings, memo=True, dsn=dsn)
            if options.warmup > 0:
                _read_until(options.warmup, "warming up, not counted", prober, jobs,
                            lambda: _topic_size(consumer, topic) - before, result, console, say)
                prober.stats = {level: LevelStats() for level in ReadLevel}
            result.stats = prober.stats
            since_ms = int(time.time() * 1000)  # the summary's delays cover the measured barriers only
            started = time.monotonic()
            before = _topic_size(consumer, topic)
            _read_until(options.seconds, "measuring", prober, jobs, lambda: _topic_size(consumer, topic) - before,
                        result, console, say)
        except (KeyboardInterrupt, SystemError) as exc:
            if signals.stopped_as(exc) is None:
                raise  # (an error a stop signal turned into another is that signal: see lockstep.signals)
            result.interrupted = True
            say("interrupted: stopping what the demo started ...")
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # let the cleanup finish
        finally:
            result.seconds = time.monotonic() - started
            try:
                result.delays = get_json(settings, f"/delays?last=100000&since_ms={since_ms}")
            except Exception:  # noqa: BLE001 - the summary says the figures are missing
                result.delays = {}
    return result


def _read_until(seconds: float, phase: str, prober: Prober, jobs: subprocess.Popen[bytes],
                purchases: Callable[[], int], result: DemoResult, console: Console, say: Callable[[str], None]) -> None:
    """Round-robin reads at each level for ``seconds``, refreshing the view. A round that finds
    no new versions to read costs no Spark work (the prober memoises), so the reader leaves the
    CPU to the jobs and still samples staleness every ``POLL_S``."""
    started = time.monotonic()
    deadline = started + seconds
    last_print = started

    def view() -> Group:
        elapsed = time.monotonic() - started
        header = Text(f"FLIP-276 shopping demo ({phase}): {elapsed:4.0f} s / {seconds:.0f} s, "
                      f"{result.purchases:,} purchases ({result.purchases / max(elapsed, 1):,.0f}/s)")
        waiting = prober.stats[ReadLevel.READ_COMMITTED]
        note = Text(f"waiting for the first barrier every table completed: {waiting.last_error}", style="yellow") \
            if waiting.reads == 0 and waiting.last_error else Text("average price must equal the unit price "
                                                                   "in every row; a row where it does not is an anomaly")
        return Group(header, level_table(prober.stats), note)

    live = Live(view(), console=console, refresh_per_second=2, transient=False) if console.is_terminal else None
    with live or nullcontext():
        while time.monotonic() < deadline:
            evaluated = prober.evaluated
            for level in ReadLevel:
                try:
                    prober.read(level)
                except CoordinatorUnreachable as exc:
                    say(f"read failed, retrying: {exc}")
                    time.sleep(1)
            if prober.evaluated == evaluated:
                time.sleep(POLL_S)  # nothing new to read: ask again soon, at no cost to Spark
            _check_running(jobs, prober.settings)
            result.purchases = purchases()
            if live is not None:
                live.update(view())
            elif time.monotonic() - last_print >= 10:
                last_print = time.monotonic()
                say(f"{phase} {last_print - started:.0f}s: " + "; ".join(
                    f"{name} {s.reads} reads, {s.anomalous_reads} with anomalies" for name, s in prober.stats.items()))

