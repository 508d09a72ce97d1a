"""Soak: the shopping topology with fast barriers for a long time; do the costs stay flat?

Starts a broker, a coordinator worker and `lockstep run` of the shopping pipeline, generates
purchases and reads FLIP-276's join at read-committed throughout (the reader of
``bench.freshness``). After ``--baseline-minutes`` (the baseline) and at the end it samples:
coordinator state records, worker RSS, a replay of the state topics (the same fold every
component runs) and how many records it read (records and tombstones Kafka has not compacted
away yet), ``/snapshot`` p99 over 200 requests, a barrier tick (``plan_barrier`` on the
replayed state), data and log files per table, and the read-committed reads' anomalies so far
(must stay 0). It prints both samples and end / baseline; issue 15's goal is every ratio within
1.5 and bounded files per table.

With ``--synthetic-jobs`` no Spark runs: the same three tables and jobs are registered, and a
thread commits every barrier for them the moment it is announced (completions as the jobs
write them, with made-up versions), so the coordinator sees barriers as fast as it announces
them. That soaks the coordinator alone (state records, RSS, replay, /snapshot, tick) through
as many barriers as ``--barrier-interval-ms`` asks, which the Spark jobs cannot sustain here.

Usage: python -m bench.soak [--minutes 30] [--baseline-minutes 5] [--rate 1000]
       [--barrier-interval-ms 200] [--retain 100] [--compact-every 100] [--vacuum-every-s 300]
       [--synthetic-jobs] [--keep]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.results import Figures, add_json_flag
from bench.stack import Processes, stack, wait_created
from bench.topologies import SHOPPING


def sample(env: dict[str, str], worker: Any, reads: Path, since: float) -> dict[str, float]:
    """One look at the running system (see the module's docstring)."""
    import psutil

    from coordinator.client.state import StateReader
    from coordinator.client.topics import Topics
    from coordinator.domain.barriers import plan_barrier
    from coordinator.domain.events import CutEntry
    from coordinator.settings import Settings

    settings = Settings.from_env(env)
    url = settings.coordinator_url
    metrics = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    records = next(float(line.split()[1]) for line in metrics.splitlines() if line.startswith("lockstep_state_records "))
    t0 = time.perf_counter()
    reader = StateReader(settings, Topics(settings.topic_prefix))
    try:
        state = reader.read_to_end()
    finally:
        reader.close()
    replay_s = time.perf_counter() - t0
    tables = ",".join(SHOPPING.aggregates)
    snapshot_ms = []
    for _ in range(200):
        t0 = time.perf_counter()
        urllib.request.urlopen(f"{url}/snapshot?tables={tables}", timeout=10).read()
        snapshot_ms.append((time.perf_counter() - t0) * 1000)
    cut = [CutEntry(SHOPPING.topic, p, 0) for p in (0, 1)]
    now = int(time.time() * 1000)
    tick_ms = []
    for _ in range(200):
        t0 = time.perf_counter()
        plan_barrier(state, now, cut, settings.barriers)
        tick_ms.append((time.perf_counter() - t0) * 1000)
    out: dict[str, float] = {
        "state records": records,
        "last barrier": state.last_barrier(),
        "worker RSS (MB)": psutil.Process(worker.proc.pid).memory_info().rss / 2**20,
        "replay (s)": replay_s,
        "records replayed": reader.stats.events_folded,  # what Kafka has not compacted away yet
        "/snapshot p99 (ms)": sorted(snapshot_ms)[int(0.99 * len(snapshot_ms)) - 1],
        "barrier tick (ms)": statistics.median(tick_ms),
    }
    for table in (SHOPPING.root, *SHOPPING.aggregates):
        root = Path(settings.table_location(table))
        out[f"{table} data files"] = sum(1 for p in root.rglob("*.parquet") if "_delta_log" not in p.parts)
        out[f"{table} log files"] = sum(1 for _ in (root / "_delta_log").glob("*")) if (root / "_delta_log").is_dir() else 0
    lines = [json.loads(line) for line in reads.read_text().splitlines() if line.strip()] if reads.exists() else []
    done = [r for r in lines if "error" not in r and r["t"] >= since]
    out["reads"] = len(done)
    out["anomalous reads"] = sum(1 for r in done if r["anomalies"])
    return out


def synthetic_jobs(env: dict[str, str], stop: threading.Event) -> threading.Thread:
    """Register the shopping tables and jobs, and commit every announced barrier for them at once."""
    from coordinator.client.commands import emit, new_request_id
    from coordinator.client.state import StateFollower
    from coordinator.client.topics import Topics
    from coordinator.domain import DeclareTable, RegisterJob
    from coordinator.settings import Settings
    from spark_jobs.runtime.commits import CompletionPublisher

    settings = Settings.from_env(env)
    aggregates = {name: f"{name}_job" for name in SHOPPING.aggregates}
    commands = [DeclareTable(new_request_id(), SHOPPING.root, "root"),
                RegisterJob(new_request_id(), "ingest_shopping", SHOPPING.root, external_topics=(SHOPPING.topic,))]
    for table, job in aggregates.items():
        commands += [DeclareTable(new_request_id(), table, "intermediate"),
                     RegisterJob(new_request_id(), job, table, sources=(SHOPPING.root,))]
    for command in commands:
        outcome = emit(settings, command)
        if not outcome.accepted:
            raise SystemExit(f"synthetic jobs: {outcome.command} rejected: {outcome.reason}")
    follower = StateFollower(settings, Topics(settings.topic_prefix))
    follower.start()
    publisher = CompletionPublisher(settings)

    def commit() -> None:
        done = 0
        while not stop.wait(0.02):
            with follower.reader.lock:
                last = follower.reader.state.last_barrier()
            for barrier in range(done + 1, last + 1):
                started = int(time.time() * 1000)
                publisher.publish("ingest_shopping", SHOPPING.root, barrier, 0, barrier, started)
                for table, job in aggregates.items():
                    publisher.publish(job, table, barrier, 0, barrier, started, source_versions={SHOPPING.root: barrier})
            done = max(done, last)
        follower.stop()

    thread = threading.Thread(target=commit, name="synthetic-jobs", daemon=True)
    thread.start()
    return thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--baseline-minutes", type=float, default=5)
    parser.add_argument("--rate", type=int, default=1000, help="purchases/s (default 1000)")
    parser.add_argument("--barrier-interval-ms", type=int, default=200)
    parser.add_argument("--retain", type=int, default=100, help="LOCKSTEP_RETAIN_BARRIERS")
    parser.add_argument("--compact-every", type=int, default=100, help="LOCKSTEP_COMPACT_EVERY")
    parser.add_argument("--vacuum-every-s", type=int, default=300, help="LOCKSTEP_VACUUM_EVERY_S")
    parser.add_argument("--synthetic-jobs", action="store_true",
                        help="no Spark: commit every barrier at once for the registered jobs (the coordinator alone)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home (logs, tables)")
    add_json_flag(parser)
    args = parser.parse_args()
    figures = Figures("soak", args)
    py = sys.executable
    with ExitStack() as cleanup:
        tmp = Path(tempfile.mkdtemp(prefix="soak-"))
        if not args.keep:
            cleanup.callback(shutil.rmtree, tmp, True)
        extra = {"LOCKSTEP_RETAIN_BARRIERS": str(args.retain), "LOCKSTEP_COMPACT_EVERY": str(args.compact_every),
                 "LOCKSTEP_VACUUM_EVERY_S": str(args.vacuum_every_s)}
        env, (_, worker) = cleanup.enter_context(stack(tmp, "lockstep", args.barrier_interval_ms, extra))
        from coordinator.settings import Settings
        from spark_jobs.demo.datagen import ensure_topic

        ensure_topic(Settings.from_env(env), SHOPPING.topic, partitions=2)
        procs = Processes()
        cleanup.callback(procs.stop_all)
        reads = tmp / "reads.jsonl"
        if args.synthetic_jobs:
            stop = threading.Event()
            cleanup.callback(stop.set)
            synthetic_jobs(env, stop)
            started = time.time()
            end = started + args.minutes * 60
            print(f"soak: {args.minutes:.0f} min, barriers every {args.barrier_interval_ms} ms, synthetic jobs; "
                  f"logs in {tmp}", flush=True)
        else:
            pipeline = tmp / "shopping.sql"
            pipeline.write_text(SHOPPING.pipeline())
            procs.start("jobs", [py, "-m", "lockstep", "run", str(pipeline)], env, tmp / "jobs.log")
            wait_created(env, list(SHOPPING.aggregates), procs, tmp / "jobs.log")
            started = time.time()
            end = started + args.minutes * 60
            procs.start("generator", [py, "-m", "bench.freshness", "child-generate", "shopping", "--rate", str(args.rate)],
                        env, tmp / "gen.log")
            procs.start("reader", [py, "-m", "bench.freshness", "child-read", "shopping", "lockstep", "--until", str(end),
                                   "--out", str(reads), "--cache"], env, tmp / "reader.log")
            print(f"soak: {args.minutes:.0f} min, barriers every {args.barrier_interval_ms} ms, {args.rate:,} purchases/s; "
                  f"logs in {tmp}", flush=True)
        samples: dict[str, dict[str, float]] = {}
        for name, at in (("baseline", started + args.baseline_minutes * 60), ("end", end)):
            while time.time() < at:
                if any(c.poll() is not None for c in procs.children.values()):
                    raise SystemExit(f"a process exited early; see the logs in {tmp} (run with --keep to keep them)")
                time.sleep(5)
            samples[name] = sample(env, worker, reads, started)
            print(f"  {name} sampled after {(time.time() - started) / 60:.1f} min", flush=True)
        base, last = samples["baseline"], samples["end"]
        print(f"{'':28}{'after ' + str(args.baseline_minutes) + ' min':>16}{'at the end':>14}{'end / baseline':>16}")
        for key in base:
            if args.synthetic_jobs and not base[key] and not last[key]:
                continue  # files and reads: no Spark ran
            ratio = f"{last[key] / base[key]:.2f}" if base[key] else "-"
            print(f"{key:28}{base[key]:16,.2f}{last[key]:14,.2f}{ratio:>16}")
            unit = key.partition(" (")[2].removesuffix(")") or "count"
            figures.add(key, last[key], unit, baseline=base[key], ratio=last[key] / base[key] if base[key] else None,
                        jobs="synthetic" if args.synthetic_jobs else "spark")
        figures.write()


if __name__ == "__main__":
    main()
