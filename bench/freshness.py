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

With ``--slow-table S`` Lockstep's pipeline also has a table over the root that the read does
not join and that waits ``S`` seconds in every barrier (a large join, say); ``--stride-after
3,0`` runs it once per value of ``LOCKSTEP_BARRIER_STRIDE_AFTER`` (0: strides off, the baseline)
and compares the reads' staleness: does one slow table age the reads of the others?

Usage::

    python -m bench.freshness                         # both topologies, both systems, 10,000/s
    python -m bench.freshness --topology counts --seconds 600 --system lockstep   # keeps up?
    python -m bench.freshness --topology counts --system lockstep --slow-table 5 --stride-after 3,0
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.freshness_report import compare_siblings, compare_strides, job_costs, report
from bench.results import Figures, add_json_flag
from bench.stack import Pid, Processes, stack, wait_created, wait_tables
from bench.topologies import TOPOLOGIES, Topology, anomalies, record_maker, with_siblings

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
    from coordinator.settings import Settings
    from lockstep_reads import SnapshotError, open_snapshot
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
                    with open_snapshot(tables, settings=settings) as light_snap:
                        key = tuple(sorted(light_snap.versions.items()))
                        rows = seen.get(key) if cache else None
                        if rows is None:
                            rows = light_snap.sql(topology.read).to_pylist()
                        barrier = light_snap.barrier
                elif system == "lockstep":
                    with open_snapshot(tables, "read-committed", settings=settings, spark=spark) as snap:
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


SLOW_TABLE = "slow_extra"


def slow_table(topology: Topology, seconds: float) -> str:
    """A Python pipeline file: a table over the root that waits ``seconds`` in every barrier."""
    return (f"import time\n\nfrom spark_jobs.api import pipelines as dp\n\n\n@dp.materialized_view(name={SLOW_TABLE!r})\n"
            f"def slow({topology.root}):\n    time.sleep({seconds!r})  # a table far slower than the rest\n"
            f"    return {topology.root}.groupBy().count()\n")


def run_system(topology: Topology, system: str, args: argparse.Namespace,
               extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    from coordinator.settings import Settings
    from spark_jobs.demo.datagen import ensure_topic

    with ExitStack() as cleanup:
        tmp = Path(tempfile.mkdtemp(prefix=f"fresh-{system}-"))
        if not args.keep:
            cleanup.callback(shutil.rmtree, tmp, True)
        else:
            print(f"  {system}: logs and data in {tmp}", flush=True)
        env, (broker, worker) = cleanup.enter_context(stack(tmp, system, args.barrier_interval_ms, extra_env))
        settings = Settings.from_env(env)
        ensure_topic(settings, topology.topic, partitions=2)
        procs = Processes()
        cleanup.callback(procs.stop_all)
        py = sys.executable
        here = [py, "-m", "bench.freshness"]
        siblings = ["--siblings", str(len(topology.aggregates))] if args.siblings else []
        pipeline = tmp / f"{topology.name}.sql"
        pipeline.write_text(topology.pipeline())
        started = time.time()
        if system == "lockstep":
            files, tables = [str(pipeline)], list(topology.aggregates)
            if args.slow_table:
                (tmp / "slow.py").write_text(slow_table(topology, args.slow_table))
                files, tables = [*files, str(tmp / "slow.py")], [*tables, SLOW_TABLE]
            run = [py, "-m", "lockstep", "run", *files, *args.run_args]
            jobs = [None] if args.lockstep_layout == "one" else [topology.root, *tables]
            for job in jobs:
                name = "jobs" if job is None else f"jobs:{job}"
                procs.start(name, run + ([] if job is None else ["--job", job]), env, tmp / f"{name}.log")
            ready = wait_created(env, tables, procs, tmp / f"{name}.log")
        else:
            jobs = [None] if args.plain_layout == "one" else [topology.root, *topology.aggregates]
            for job in jobs:
                procs.start(f"jobs:{job or 'all'}", [*here, "child-plain", topology.name, *siblings,
                                                     *(["--only", job] if job else [])],
                            env, tmp / f"jobs-{job or 'all'}.log")
            ready = wait_tables(settings, [topology.root, *topology.aggregates], procs)
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
        procs.children["broker"] = Pid(broker.running_pid())  # type: ignore[assignment]
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
            result["jobs"] = job_costs(settings, topology, gen_start + args.warmup, until, gen_start)
        procs.stop_all()
        return result


def _reads(path: Path, after: float) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in lines if r["t"] >= after and "error" not in r]


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
    parser.add_argument("--siblings", default="",
                        help="counts only: this many aggregates over the root (default 2, as defined); several, "
                             "comma-separated (1,3,10), run one after another and are compared with the first")
    parser.add_argument("--slow-table", type=float, default=0.0,
                        help="Lockstep only: add a table over the root, not read, that waits this many seconds in "
                             "every barrier (default 0: none)")
    parser.add_argument("--stride-after", default="",
                        help="Lockstep only: run once per LOCKSTEP_BARRIER_STRIDE_AFTER value, comma-separated (3,0: "
                             "strides as by default, then off), compared with the last one")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home (logs, tables) for a look")
    parser.add_argument("--run-arg", dest="run_args", action="append", default=[], help="extra `lockstep run` argument")
    add_json_flag(parser)
    args = parser.parse_args()
    if args.command is None:
        def numbers(flag: str, text: str, example: str) -> list[int]:
            try:
                return [int(n) for n in text.split(",") if n.strip()]
            except ValueError:
                parser.error(f"--{flag} {text!r}: give a whole number, or several separated by commas ({example})")

        args.sibling_counts = numbers("siblings", str(args.siblings), "1,3,10")
        args.siblings = bool(args.sibling_counts)
        args.stride_values = numbers("stride-after", str(args.stride_after), "3,0")
        if (args.slow_table or args.stride_values) and args.system != "lockstep":
            parser.error("--slow-table and --stride-after measure Lockstep alone: add --system lockstep")
    if args.command == "child-generate":
        return child_generate(TOPOLOGIES[args.topology], args.rate)
    if args.command == "child-plain":
        return child_plain(with_siblings(TOPOLOGIES[args.topology], args.siblings), args.only)
    if args.command == "child-read":
        return child_read(with_siblings(TOPOLOGIES[args.topology], args.siblings), args.system, args.until, args.out,
                          args.nice, args.cache, args.every_s, args.engine)
    topologies = list(TOPOLOGIES.values()) if args.topology == "all" else [TOPOLOGIES[args.topology]]
    topologies = [with_siblings(t, n) for t in topologies for n in (args.sibling_counts or [0])]
    systems = ["lockstep", "plain"] if args.system == "both" else [args.system]
    figures = Figures("freshness", args)
    grown: list[dict[str, Any]] = []
    strided: list[tuple[int, dict[str, Any]]] = []
    try:
        for topology in topologies:
            if args.stride_values:
                for value in args.stride_values:
                    print(f"{topology.name}: running lockstep, LOCKSTEP_BARRIER_STRIDE_AFTER={value} ...", flush=True)
                    result = run_system(topology, "lockstep", args, {"LOCKSTEP_BARRIER_STRIDE_AFTER": str(value)})
                    strided.append((value, report(topology, {"lockstep": result}, args, figures)))
                continue
            results = {}
            for system in systems:
                print(f"{topology.name}: running {system} ...", flush=True)
                results[system] = run_system(topology, system, args)
            grown.append(report(topology, results, args, figures))
        compare_siblings(grown, figures)
        compare_strides(strided, figures)
    finally:  # a topology that failed after one was reported: keep that one's figures
        if figures.figures:
            figures.write()


if __name__ == "__main__":
    main()
