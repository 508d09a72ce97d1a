"""Freshness of consistent reads under load: Lockstep against plain Structured Streaming.

For each topology, one run of each system on a fresh local broker:

* a generator process feeds the root topic at ``--rate`` records/s; every record carries its
  produce time ``ts``, and every aggregate keeps ``MAX(ts)``;
* the jobs run as a user runs them: Lockstep's ``lockstep run PIPELINE`` against a coordinator
  worker, or the same topology as plain Structured Streaming queries (Kafka -> Delta append,
  streaming aggregations over that Delta table in complete mode, no barriers);
* a reader in its own process (its own Spark) reads back to back: Lockstep at read-committed,
  plain at each table's latest version. Staleness of a read = the time the rows are in hand
  minus the newest produce time visible in them (so it counts the wait for the barrier too);
  an anomaly is a row that no consistent state could produce. With ``--reader-cache`` both
  readers reuse the rows of an earlier read of the same table versions instead of running the
  query again (the jobs then get the CPU a back-to-back reader takes).

Printed: staleness percentiles after ``--warmup`` and their trend (does it grow?), reads per
second, anomalies, the ratio Lockstep / plain, CPU used per process, and for Lockstep the
per-barrier cost of every job (waiting, planning, Spark, commit, publish).

Usage::

    python -m bench.freshness                         # both topologies, both systems, 10,000/s
    python -m bench.freshness --topology counts --seconds 600 --system lockstep   # keeps up?
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.domain.delays import percentile
from coordinator.domain.pacing import ready_at

if TYPE_CHECKING:
    from spark_jobs.demo.datagen import RecordMaker

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Topology:
    """A root table from ``topic``, two aggregates over it, and a read that joins them."""

    name: str
    topic: str
    root: str
    root_ddl: str
    aggregates: dict[str, str]  # table -> query over the root table
    read: str  # the reader's query; yields newest_ts per row and what ``anomalies`` checks
    keys: int

    @property
    def read_tables(self) -> list[str]:
        """The aggregates the reader's query joins (a snapshot of just those)."""
        return [t for t in self.aggregates if re.search(rf"\b{t}\b", self.read)]

    def pipeline(self) -> str:
        create = [f"CREATE TABLE {self.root} ({self.root_ddl}) WITH ('source' = 'kafka:{self.topic}', 'format' = 'json');"]
        return "\n".join(create + [f"CREATE TABLE {t} AS {q};" for t, q in self.aggregates.items()])


SHOPPING = Topology(
    "shopping", "shopping_source", "shopping", "user_id BIGINT, item_id BIGINT, amount BIGINT, price DOUBLE, ts BIGINT",
    {"user_item_amount": "SELECT user_id, item_id, SUM(amount) AS total_amount, MAX(ts) AS newest_ts "
                         "FROM shopping GROUP BY user_id, item_id",
     "user_item_price": "SELECT user_id, item_id, SUM(price) AS total_price, MAX(ts) AS newest_ts "
                        "FROM shopping GROUP BY user_id, item_id"},
    "SELECT a.item_id, p.total_price / a.total_amount AS avg_price, GREATEST(a.newest_ts, p.newest_ts) AS newest_ts "
    "FROM user_item_amount a JOIN user_item_price p ON a.user_id = p.user_id AND a.item_id = p.item_id",
    keys=100 * 20)
COUNTS = Topology(
    "counts", "events_source", "events", "k BIGINT, v BIGINT, ts BIGINT",
    {"totals": "SELECT k, SUM(v) AS total, COUNT(*) AS n, MAX(ts) AS newest_ts FROM events GROUP BY k",
     "spans": "SELECT k, COUNT(*) AS n, MIN(v) AS lo, MAX(v) AS hi, MAX(ts) AS newest_ts FROM events GROUP BY k"},
    "SELECT t.n AS n1, s.n AS n2, GREATEST(t.newest_ts, s.newest_ts) AS newest_ts "
    "FROM totals t FULL OUTER JOIN spans s ON t.k = s.k",
    keys=1000)
TOPOLOGIES = {t.name: t for t in (SHOPPING, COUNTS)}


def with_siblings(topology: Topology, siblings: int) -> Topology:
    """``counts`` with ``siblings`` aggregates over its root (0: as it is, two): one reads
    ``totals`` alone; more add aggregates the read does not join, whose jobs compete for the
    same CPU and barriers (the cost of a topology that grows)."""
    if not siblings or siblings == len(topology.aggregates):
        return topology
    if topology is not COUNTS:
        raise SystemExit("--siblings applies to the counts topology")
    if siblings == 1:
        return replace(topology, aggregates={"totals": topology.aggregates["totals"]},
                       read="SELECT n AS n1, n AS n2, newest_ts FROM totals")
    extra = {f"extra_{i}": f"SELECT k, COUNT(*) AS n, SUM(v * {i + 2}) AS total, MAX(ts) AS newest_ts FROM events GROUP BY k"
             for i in range(siblings - 2)}  # maintained as totals is (`lockstep explain`: incremental aggregate)
    return replace(topology, aggregates={**topology.aggregates, **extra})


def anomalies(topology: Topology, rows: list[Any]) -> int:
    """Rows no consistent state could hold: an average price that is not the unit price
    (shopping), or two counts of the same key that differ (counts)."""
    if topology is SHOPPING:
        from spark_jobs.demo.probes import wrong_prices

        return wrong_prices(rows)
    return sum(1 for r in rows if r["n1"] != r["n2"])


def record_maker(topology: Topology) -> RecordMaker:
    from spark_jobs.demo.datagen import purchases

    if topology is SHOPPING:
        return purchases(users=100, items=20)

    def event(rng: random.Random, ts: int) -> tuple[str, dict[str, int | float]]:
        k = rng.randrange(topology.keys)
        return str(k), {"k": k, "v": rng.randrange(1000), "ts": ts}

    return event


# -- child processes ---------------------------------------------------------------------------------


def child_generate(topology: Topology, rate: int) -> None:
    import threading

    from coordinator.settings import Settings
    from spark_jobs.demo.datagen import RateGenerator

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    generator = RateGenerator(Settings.from_env(), topology.topic, rate, record_maker(topology))
    generator.run(stop, progress=lambda line: print(line, flush=True), every=10)
    print(f"sent {generator.sent} failed {generator.failed}", flush=True)


def child_plain(topology: Topology, only: str | None) -> None:
    """The topology as plain Structured Streaming queries (no barriers, no coordinator)."""
    from pyspark.sql import functions as F

    from coordinator.settings import Settings
    from spark_jobs.runtime.session import build_session

    settings = Settings.from_env()
    spark = build_session(f"plain-{only or topology.name}", settings=settings)
    wh, checkpoints = Path(settings.table_location("")), settings.checkpoints
    root = str(wh / topology.root)
    queries = []
    if only in (None, topology.root):
        parsed = F.from_json(F.col("value").cast("string"), topology.root_ddl).alias("r")
        queries.append(
            spark.readStream.format("kafka").option("kafka.bootstrap.servers", settings.bootstrap)
            .option("subscribe", topology.topic).option("startingOffsets", "earliest").load()
            .select(parsed).select("r.*").writeStream.format("delta").queryName(topology.root)
            .option("checkpointLocation", str(checkpoints / topology.root)).start(root))
    for table, query in topology.aggregates.items():
        if only not in (None, table):
            continue
        while not (Path(root) / "_delta_log").is_dir():  # the root query creates its table
            time.sleep(0.2)
        session = spark.newSession()
        session.readStream.format("delta").load(root).createOrReplaceTempView(topology.root)
        queries.append(
            session.sql(query).writeStream.format("delta").outputMode("complete").queryName(table)
            .option("checkpointLocation", str(checkpoints / table)).start(str(wh / table)))
    signal.signal(signal.SIGTERM, lambda *_: [q.stop() for q in queries])
    try:
        spark.streams.awaitAnyTermination()
    except KeyboardInterrupt:
        pass
    for q in queries:
        q.stop()


def yield_cpu(nice: int) -> None:
    """Lower this process's priority (and its children's, the reader's Spark JVM) by ``nice``.
    Linux shares the CPU between sessions first (autogroups) and only then by niceness, and
    every process here runs in a session of its own: so the session's niceness is set too."""
    os.nice(nice)
    try:
        Path("/proc/self/autogroup").write_text(f"{nice}\n")
    except OSError:
        pass  # no autogroups on this kernel: niceness alone applies


CACHED_PAUSE_S = 0.05  # a caching reader's pause after a read that found nothing new


def child_read(topology: Topology, system: str, until: float, out: Path, nice: int, cache: bool,
               every_s: float = 0.0, engine: str = "light") -> None:
    """Reads back to back (or one read every ``every_s``) until ``until`` (epoch s); one JSON line
    per read. At ``nice`` > 0 the
    reader takes the CPU the jobs leave, so it measures the pipeline instead of slowing it.
    With ``cache`` a read of the same table versions as an earlier one returns that read's rows
    without Spark (Delta versions never change): both systems' readers then cost CPU only when
    there is something new to read (plain: its tables' newest versions, from their logs).
    Lockstep's reader reads the light way (``lockstep_reads``, no JVM) unless ``engine`` is
    ``spark``; the plain reader always uses Spark (plain Delta has no barriers to pin)."""
    yield_cpu(nice)
    import lockstep_reads
    from coordinator.settings import Settings
    from spark_jobs.api.reads import SnapshotError, open_snapshot
    from spark_jobs.runtime.delta_log import latest_version
    from spark_jobs.runtime.session import build_session

    settings = Settings.from_env()
    light = system == "lockstep" and engine == "light"
    spark = None if light else build_session(f"reader-{system}", settings=settings)
    tables = topology.read_tables
    seen: dict[tuple[tuple[str, int | None], ...], list[Any]] = {}
    with open(out, "w") as sink:
        while time.time() < until:
            t0 = time.time()
            try:
                if light:
                    with lockstep_reads.open_snapshot(tables, settings=settings) as light_snap:
                        key = tuple(sorted(light_snap.versions.items()))
                        rows = seen.get(key) if cache else None
                        if rows is None:
                            rows = light_snap.sql(topology.read).to_pylist()
                        barrier = light_snap.barrier
                elif system == "lockstep":
                    with open_snapshot(spark, tables, "read-committed", settings=settings) as snap:
                        key = tuple(sorted(snap.versions.items()))
                        rows = seen.get(key) if cache else None
                        if rows is None:
                            rows = snap.sql(topology.read).collect()
                        barrier = snap.barrier
                else:
                    paths = {t: settings.table_location(t) for t in tables}
                    versions = {t: latest_version(spark, path) for t, path in paths.items()} if cache else {}
                    key = tuple(sorted(versions.items()))
                    rows = seen.get(key) if cache else None
                    if rows is None:
                        for t, path in paths.items():
                            reader = spark.read.format("delta")
                            if cache:
                                reader = reader.option("versionAsOf", versions[t])
                            reader.load(path).createOrReplaceTempView(t)
                        rows = spark.sql(topology.read).collect()
                    barrier = None
                if cache:
                    if key in seen:
                        time.sleep(CACHED_PAUSE_S)  # nothing new: ask again soon, without hammering the coordinator
                    seen = {key: rows}  # readers move forward: the newest versions are the ones asked again
            except (SnapshotError, Exception) as exc:  # noqa: BLE001 - not ready yet: tables not created
                sink.write(json.dumps({"t": time.time(), "error": str(exc).splitlines()[0][:200]}) + "\n")
                time.sleep(0.5)
                continue
            now = time.time()
            newest = max((r["newest_ts"] for r in rows if r["newest_ts"] is not None), default=None)
            sink.write(json.dumps({"t": now, "read_ms": int((now - t0) * 1000), "rows": len(rows), "barrier": barrier,
                                   "staleness_ms": None if newest is None else int(now * 1000) - newest,
                                   "anomalies": anomalies(topology, rows)}) + "\n")
            sink.flush()
            time.sleep(max(0.0, t0 + every_s - time.time()))
    if spark is not None:
        spark.stop()


# -- the run ----------------------------------------------------------------------------------------


@dataclass
class Processes:
    """Child processes by role, for CPU accounting and clean-up."""

    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    cpu_at_start: dict[str, float] = field(default_factory=dict)

    def start(self, role: str, command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            child = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                     start_new_session=True)
        self.children[role] = child
        return child

    def cpu(self) -> dict[str, float]:
        """CPU seconds (user + system) of each role's process tree so far."""
        import psutil

        out = {}
        for role, child in self.children.items():
            total = 0.0
            try:
                proc = psutil.Process(child.pid)
                for p in [proc, *proc.children(recursive=True)]:
                    try:
                        t = p.cpu_times()
                        total += t.user + t.system + t.children_user + t.children_system
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
            out[role] = total
        return out

    def stop(self, role: str, timeout: float = 60) -> None:
        child = self.children.get(role)
        if child is None or child.poll() is not None:
            return
        os.killpg(child.pid, signal.SIGINT)
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)

    def stop_all(self) -> None:
        for role in reversed(list(self.children)):
            self.stop(role)


@contextmanager
def stack(tmp: Path, system: str, barrier_interval_ms: int | None,
          extra_env: dict[str, str] | None = None) -> Iterator[tuple[dict[str, str], Any]]:
    """A broker on a free port and, for Lockstep, a coordinator worker; the environment to reach them."""
    from bench.coordinator import start_broker
    from coordinator.dev.broker import free_port
    from coordinator.dev.worker import WorkerProcess

    broker = start_broker(tmp)
    env = {**os.environ, "LOCKSTEP_BOOTSTRAP": broker.bootstrap, "LOCKSTEP_HOME": str(tmp / "home"),
           "LOCKSTEP_JARS": str(ROOT / ".lockstep" / "jars"), "LOCKSTEP_TOPIC_PREFIX": "bench",
           "PYSPARK_PYTHON": sys.executable, "LOCKSTEP_SPARK_LOG_LEVEL": "ERROR"}
    if barrier_interval_ms is not None:
        env["LOCKSTEP_BARRIER_INTERVAL_MS"] = str(barrier_interval_ms)
    env.update(extra_env or {})
    worker = None
    try:
        if system == "lockstep":
            port = free_port()
            env["LOCKSTEP_COORDINATOR_URL"] = f"http://127.0.0.1:{port}"
            worker = WorkerProcess(env, port, tmp / "worker.log").start()
        yield env, (broker, worker)
    finally:
        if worker is not None:
            worker.stop()
        broker.down()


def run_system(topology: Topology, system: str, args: argparse.Namespace) -> dict[str, Any]:
    from coordinator.settings import Settings
    from spark_jobs.demo.datagen import ensure_topic

    with ExitStack() as cleanup:
        tmp = Path(tempfile.mkdtemp(prefix=f"fresh-{system}-"))
        if not args.keep:
            cleanup.callback(shutil.rmtree, tmp, True)
        else:
            print(f"  {system}: logs and data in {tmp}", flush=True)
        env, (broker, worker) = cleanup.enter_context(stack(tmp, system, args.barrier_interval_ms))
        settings = Settings.from_env(env)
        ensure_topic(settings, topology.topic, partitions=2)
        procs = Processes()
        cleanup.callback(procs.stop_all)
        py = sys.executable
        here = [py, "-m", "bench.freshness"]
        siblings = ["--siblings", str(args.siblings)] if args.siblings else []
        pipeline = tmp / f"{topology.name}.sql"
        pipeline.write_text(topology.pipeline())
        started = time.time()
        if system == "lockstep":
            run = [py, "-m", "lockstep", "run", str(pipeline), *args.run_args]
            jobs = [None] if args.lockstep_layout == "one" else [topology.root, *topology.aggregates]
            for job in jobs:
                name = "jobs" if job is None else f"jobs:{job}"
                procs.start(name, run + ([] if job is None else ["--job", job]), env, tmp / f"{name}.log")
            ready = _wait_created(env, list(topology.aggregates), procs, tmp / f"{name}.log")
        else:
            jobs = [None] if args.plain_layout == "one" else [topology.root, *topology.aggregates]
            for job in jobs:
                procs.start(f"jobs:{job or 'all'}", [*here, "child-plain", topology.name, *siblings,
                                                     *(["--only", job] if job else [])],
                            env, tmp / f"jobs-{job or 'all'}.log")
            ready = _wait_tables(settings, [topology.root, *topology.aggregates], procs)
        print(f"  {system}: jobs ready after {ready - started:.0f} s", flush=True)
        gen_start = time.time()
        procs.start("generator", [*here, "child-generate", topology.name, "--rate", str(args.rate)], env, tmp / "gen.log")
        until = gen_start + args.warmup + args.seconds
        reads = tmp / "reads.jsonl"
        procs.start("reader", [*here, "child-read", topology.name, system, "--until", str(until), "--out", str(reads),
                               "--nice", str(args.reader_nice), *(["--cache"] if args.reader_cache else []),
                               "--every-s", str(1 / args.reads_per_s if args.reads_per_s else 0), *siblings,
                               "--engine", args.lockstep_reader],
                   env, tmp / "reader.log")
        procs.children["broker"] = _Pid(broker.running_pid())  # type: ignore[assignment]
        if worker is not None:
            procs.children["coordinator"] = worker.proc  # type: ignore[assignment]
        time.sleep(max(0.0, gen_start + args.warmup - time.time()))
        cpu0, t_cpu0 = procs.cpu(), time.time()
        while time.time() < until:
            for role in ("generator", "reader"):
                if procs.children[role].poll() is not None:
                    raise SystemExit(f"{role} exited early; see its log in {tmp}:\n"
                                     + (tmp / ("gen.log" if role == "generator" else "reader.log")).read_text()[-3000:])
            time.sleep(1)
        cpu1, t_cpu1 = procs.cpu(), time.time()
        procs.children["reader"].wait(120)
        result: dict[str, Any] = {"reads": _reads(reads, gen_start + args.warmup),
                                  "cpu": {r: (cpu1[r] - cpu0.get(r, 0)) / (t_cpu1 - t_cpu0) for r in cpu1}}
        procs.stop("generator")
        result["generated"] = (tmp / "gen.log").read_text().strip().splitlines()[-1:]
        if system == "lockstep":
            result["jobs"] = _job_costs(settings, topology, gen_start + args.warmup, until, gen_start)
        procs.stop_all()
        return result


class _Pid:
    """A process the bench did not start as a child (the broker), for CPU accounting only."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid or -1

    def poll(self) -> int | None:
        return 0  # never stopped by the bench: the broker's own down() does that


def _wait_created(env: dict[str, str], tables: list[str], procs: Processes, log: Path, timeout: float = 300) -> float:
    """Until every table has an exact point (a CTAS table exists once its first barrier committed)."""
    from coordinator.client.rest import get_json
    from coordinator.settings import Settings

    settings = Settings.from_env(env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(c.poll() is not None for role, c in procs.children.items() if role.startswith("jobs")):
            raise SystemExit(f"lockstep run exited:\n{log.read_text()[-3000:]}")
        try:
            if set(tables) <= set(get_json(settings, "/topology")["tables"]):
                return time.time()
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.5)
    raise SystemExit(f"tables not created within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _wait_tables(settings: Any, tables: list[str], procs: Processes, timeout: float = 300) -> float:
    """Until every plain query has made its table (its first micro-batch committed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(c.poll() is not None for role, c in procs.children.items() if role.startswith("jobs")):
            raise SystemExit("a plain query process exited; run with --keep and read its log")
        if all((Path(settings.table_location(t)) / "_delta_log" / f"{0:020d}.json").exists() for t in tables):
            return time.time()
        time.sleep(0.5)
    raise SystemExit(f"plain tables not created within {timeout:.0f} s")


def _reads(path: Path, after: float) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in lines if r["t"] >= after and "error" not in r]


SLICE_S = 30  # the timeline's step


def _job_costs(settings: Any, topology: Topology, start: float, end: float, load_start: float) -> dict[str, Any]:
    """Per job, over the barriers announced in the measured window: how long each one waited
    for its inputs, took, and (where the job reports it) where that time went; and its E2E p50
    in each ``SLICE_S`` since the load began (the warm-up too), to see how long a start lasts."""
    from coordinator.client.state import read_state

    state = read_state(settings)
    window = {b: a for b, a in state.barriers.items() if start * 1000 <= a.ts_ms <= end * 1000}
    out: dict[str, Any] = {"barriers": len(window)}
    if len(window) > 1:
        ts = sorted(a.ts_ms for a in window.values())
        out["interval_ms"] = statistics.median(b - a for a, b in zip(ts, ts[1:], strict=False))
    for job in sorted(state.jobs.values(), key=lambda j: (bool(j.sources), j.job_id)):
        done = state.completions.get(job.sink, {})
        rows: dict[str, list[float]] = {}
        for b in sorted(window):
            c = done.get(b)
            if c is None or not c.started_at_ms:
                continue
            ready = ready_at(state, job, b)
            if ready is None:
                continue
            rows.setdefault("wait", []).append(c.started_at_ms - ready)
            rows.setdefault("process", []).append(c.committed_at_ms - c.started_at_ms)
            rows.setdefault("e2e", []).append(c.committed_at_ms - window[b].ts_ms)
            rows.setdefault("rows_in", []).append(c.rows_in)
            for phase in getattr(c, "phases", ()):
                rows.setdefault(phase.name, []).append(phase.ms)
        out[job.job_id] = {k: (statistics.median(v), percentile(v, 0.9)) for k, v in rows.items()}
        out[job.job_id]["committed"] = len(rows.get("process", []))
        slices: list[list[float]] = [[] for _ in range(int((end - load_start) // SLICE_S) + 1)]
        for b, announced in state.barriers.items():
            if (c := done.get(b)) is not None and load_start * 1000 <= announced.ts_ms <= end * 1000:
                slices[int((announced.ts_ms / 1000 - load_start) // SLICE_S)].append(c.committed_at_ms - announced.ts_ms)
        out[job.job_id]["timeline"] = [statistics.median(s) / 1000 if s else None for s in slices]
    return out


def _quarters(reads: list[dict[str, Any]]) -> list[list[float]]:
    """Staleness (s) of the reads in each quarter of the window: a growing p50 means falling behind."""
    if not reads:
        return []
    start, span = reads[0]["t"], max(1e-9, reads[-1]["t"] - reads[0]["t"])
    out: list[list[float]] = [[], [], [], []]
    for r in reads:
        if r["staleness_ms"] is not None:
            out[min(3, int(4 * (r["t"] - start) / span))].append(r["staleness_ms"] / 1000)
    return out


def report(topology: Topology, results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    reader = "reader caches by versions" if args.reader_cache else "every read runs the query"
    reader += f", {args.reads_per_s:g} read(s)/s at most" if args.reads_per_s else ", back to back"
    if args.siblings:
        reader += f"; {len(topology.aggregates)} aggregate(s) over the root"
    print(f"\n== {topology.name}: {args.rate:,} records/s, {args.seconds:.0f} s measured after {args.warmup:.0f} s warm-up; "
          f"{reader}")
    rows = []
    summary: dict[str, dict[str, float | None]] = {}
    for system, res in results.items():
        reads = res["reads"]
        stale = [r["staleness_ms"] / 1000 for r in reads if r["staleness_ms"] is not None]
        summary[system] = {"p50": percentile(stale, 0.5), "p90": percentile(stale, 0.9), "p99": percentile(stale, 0.99),
                           "max": max(stale, default=None)}
        quarters = _quarters(reads)
        bad = [r for r in reads if r["anomalies"]]
        rows.append((system, len(reads), len(reads) / args.seconds, summary[system], len(bad), sum(r["anomalies"] for r in bad),
                     [percentile(q, 0.5) for q in quarters], statistics.median([r["read_ms"] for r in reads]) if reads else None))
    print(f"{'system':10s} {'reads':>6s} {'reads/s':>7s} {'stale p50':>9s} {'p90':>6s} {'p99':>6s} {'max':>6s} "
          f"{'anomalous reads (rows)':>23s}  {'p50 per quarter':24s} {'read p50':>8s}")
    for system, n, rate, s, bad, bad_rows, quarters, read_ms in rows:
        fmt = lambda v: "-" if v is None else f"{v:6.2f}"  # noqa: E731
        print(f"{system:10s} {n:6d} {rate:7.2f} {fmt(s['p50']):>9s} {fmt(s['p90'])} {fmt(s['p99'])} {fmt(s['max'])} "
              f"{f'{bad} ({bad_rows})':>23s}  {' '.join(fmt(q) for q in quarters):24s} {read_ms or 0:6.0f}ms")
    if "lockstep" in summary and "plain" in summary and summary["plain"]["p50"]:
        ls, pl = summary["lockstep"], summary["plain"]
        print("ratio lockstep / plain staleness: " + ", ".join(
            f"{k} {ls[k] / pl[k]:.2f}" for k in ("p50", "p90", "p99") if ls[k] is not None and pl[k]))
    for system, res in results.items():
        print(f"{system} CPU (cores busy): " + ", ".join(f"{r} {c:.2f}" for r, c in sorted(res["cpu"].items())) +
              f"; total {sum(res['cpu'].values()):.2f}; generator: {' '.join(res['generated'])}")
    jobs = results.get("lockstep", {}).get("jobs")
    if jobs:
        print(f"lockstep barriers in the window: {jobs['barriers']}, interval p50 {jobs.get('interval_ms', 0):.0f} ms")
        print("per barrier, p50 / p90 in ms (wait: inputs ready -> job starts; process: start -> committed; "
              "e2e: announced -> committed):")
        for job, costs in jobs.items():
            if not isinstance(costs, dict):
                continue
            parts = ", ".join(f"{k} {v[0]:.0f}/{v[1]:.0f}" for k, v in costs.items() if k not in ("committed", "timeline"))
            print(f"  {job:24s} {costs['committed']:4d} barriers: {parts}")
        print(f"e2e p50 in s per {SLICE_S} s since the load began (the warm-up first):")
        for job, costs in jobs.items():
            if isinstance(costs, dict):
                print(f"  {job:24s} " + " ".join("-" if v is None else f"{v:.1f}" for v in costs["timeline"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("child-generate")
    gen.add_argument("topology", choices=TOPOLOGIES)
    gen.add_argument("--rate", type=int, required=True)
    plain = sub.add_parser("child-plain")
    plain.add_argument("topology", choices=TOPOLOGIES)
    plain.add_argument("--only")
    plain.add_argument("--siblings", type=int, default=0)
    read = sub.add_parser("child-read")
    read.add_argument("topology", choices=TOPOLOGIES)
    read.add_argument("system", choices=["lockstep", "plain"])
    read.add_argument("--until", type=float, required=True)
    read.add_argument("--out", type=Path, required=True)
    read.add_argument("--nice", type=int, default=0)
    read.add_argument("--cache", action="store_true")
    read.add_argument("--every-s", type=float, default=0.0)
    read.add_argument("--siblings", type=int, default=0)
    read.add_argument("--engine", choices=["light", "spark"], default="light")
    parser.add_argument("--topology", choices=[*TOPOLOGIES, "all"], default="all")
    parser.add_argument("--system", choices=["lockstep", "plain", "both"], default="both")
    parser.add_argument("--rate", type=int, default=10_000, help="records/s into the root topic (default 10,000)")
    parser.add_argument("--seconds", type=float, default=120, help="measured seconds after the warm-up (default 120)")
    parser.add_argument("--warmup", type=float, default=30, help="seconds before measuring (default 30)")
    parser.add_argument("--barrier-interval-ms", type=int, default=None, help="LOCKSTEP_BARRIER_INTERVAL_MS for the run")
    parser.add_argument("--lockstep-layout", choices=["one", "per-job"], default="one",
                        help="Lockstep's jobs in one `lockstep run` (one Spark application) or one per job (default one)")
    parser.add_argument("--plain-layout", choices=["one", "per-job"], default="per-job",
                        help="plain queries in one Spark application or one per query (default per-job)")
    parser.add_argument("--lockstep-reader", choices=["light", "spark"], default="light",
                        help="Lockstep's reader: light (delta-rs and DataFusion, no JVM) or spark (its own session)")
    parser.add_argument("--reader-nice", type=int, default=0,
                        help="the reader's niceness: 0 (default) shares the CPU fairly with the jobs, as the issue's "
                             "reader does; 10 leaves it what the jobs do not use (it then reads rarely)")
    parser.add_argument("--reader-cache", action="store_true",
                        help="both readers reuse the rows of a read of the same table versions (no Spark work when "
                             "nothing is new), pausing 50 ms after such a read; default: every read runs the query")
    parser.add_argument("--reads-per-s", type=float, default=0.0,
                        help="at most this many reads a second (default 0: back to back); the issue that set the "
                             "freshness targets measured with a reader of ~1 read/s")
    parser.add_argument("--siblings", type=int, default=0,
                        help="counts only: this many aggregates over the root (1, 3, 10 ...; default 2, as defined)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home (logs, tables) for a look")
    parser.add_argument("--run-arg", dest="run_args", action="append", default=[], help="extra `lockstep run` argument")
    args = parser.parse_args()
    if args.command == "child-generate":
        return child_generate(TOPOLOGIES[args.topology], args.rate)
    if args.command == "child-plain":
        return child_plain(with_siblings(TOPOLOGIES[args.topology], args.siblings), args.only)
    if args.command == "child-read":
        return child_read(with_siblings(TOPOLOGIES[args.topology], args.siblings), args.system, args.until, args.out,
                          args.nice, args.cache, args.every_s, args.engine)
    topologies = list(TOPOLOGIES.values()) if args.topology == "all" else [TOPOLOGIES[args.topology]]
    topologies = [with_siblings(t, args.siblings) for t in topologies]
    systems = ["lockstep", "plain"] if args.system == "both" else [args.system]
    for topology in topologies:
        results = {}
        for system in systems:
            print(f"{topology.name}: running {system} ...", flush=True)
            results[system] = run_system(topology, system, args)
        report(topology, results, args)


if __name__ == "__main__":
    main()
