"""Recovery time: a `lockstep run` killed with SIGKILL and started again, from its start to each
job's first commit, against a plain Structured Streaming query (Kafka -> Delta append in
``foreachBatch``, the same session settings and jars) killed and restarted from its checkpoint
the same way: the baseline, in the same run, rounds alternating.

The pipeline is the drills' shape: a root table of {"k", "seq"} records from a 2-partition topic
fed at ``--rate`` records/s, and an aggregate over it. Each round kills the process once its jobs
committed again (or the plain query wrote again) and some seconds more have passed, so every
restart has a backlog of a few barriers. Printed per system: median, min and max of start ->
Spark session up (the runner's "Spark session up" line; the plain query prints one too), ->
first commit of each job, and the first commit's phases (from its completion) next to a steady
commit's. ``--keyed`` adds the aggregate kept in Spark's state store (``'state' = 'keyed'``):
its restart reloads that state from its checkpoint; its state's size on disk is printed.

Usage: python -m bench.restart [--rounds 4] [--rate 200] [--keyed]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.results import Figures, add_json_flag
from bench.stack import stack

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = """
CREATE TABLE events (k BIGINT, seq BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE per_key AS SELECT k, COUNT(*) AS n, MAX(seq) AS last_seq, SUM(seq) AS total FROM events GROUP BY k;
"""
TOPIC = "restart_events"
KEYED = """
CREATE TABLE per_key_state WITH ('state' = 'keyed') AS
  SELECT k, COUNT(*) AS n, MAX(seq) AS last_seq, SUM(seq) AS total FROM events GROUP BY k;
"""
SESSION_UP = "Spark session up"


class Feed(threading.Thread):
    """{"k", "seq"} records at ``rate`` a second until ``halt``."""

    def __init__(self, bootstrap: str, rate: int) -> None:
        from confluent_kafka import Producer

        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.rate, self.halt = rate, threading.Event()

    def run(self) -> None:
        i = 0
        while not self.halt.is_set():
            for _ in range(max(1, self.rate // 20)):
                self.producer.produce(TOPIC, key=str(i % 7).encode(), value=json.dumps({"k": i % 7, "seq": i}).encode())
                i += 1
            self.producer.poll(0)
            time.sleep(0.05)
        self.producer.flush(10)


class Child:
    """A process in its own group whose output lines are timestamped as they arrive."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path) -> None:
        self.started = time.monotonic()
        self.started_ms = int(time.time() * 1000)
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
                                     start_new_session=True, text=True)
        self.lines: list[tuple[float, str]] = []
        self._log = log
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self._log, "a") as out:
            for line in self.proc.stdout:
                self.lines.append((time.monotonic() - self.started, line.rstrip()))
                out.write(line)

    def said(self, text: str) -> float | None:
        """Seconds from start until a line containing ``text``, if one came."""
        return next((at for at, line in self.lines if text in line), None)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        time.sleep(1)  # the JVM child leaves with its group


def plain_job(bootstrap: str, warehouse: str, checkpoint: str) -> None:
    """The baseline's process: Kafka -> Delta append per micro-batch, restarted from ``checkpoint``."""
    from pyspark.sql import functions as F

    from coordinator.settings import Settings
    from spark_jobs.runtime.session import build_session

    spark = build_session("plain-restart", settings=dataclasses.replace(Settings.from_env(), warehouse=warehouse))
    print(SESSION_UP, flush=True)
    frame = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", TOPIC)
             .option("startingOffsets", "earliest").load()
             .select(F.from_json(F.col("value").cast("string"), "k BIGINT, seq BIGINT").alias("r")).select("r.*"))
    path = f"{warehouse}/plain_events"

    def write(batch: Any, batch_id: int) -> None:
        batch.write.format("delta").mode("append").save(path)
        print(f"committed batch {batch_id}", flush=True)

    (frame.writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
     .trigger(processingTime="500 milliseconds").start().awaitTermination())


def first_commits(settings: Any, tables: list[str], since_ms: int) -> dict[str, Any]:
    """table -> its first completion committed after ``since_ms``."""
    from coordinator.client.state import read_state

    state = read_state(settings)
    out = {}
    for table in tables:
        after = [c for c in state.completions.get(table, {}).values() if c.committed_at_ms >= since_ms]
        if after:
            out[table] = min(after, key=lambda c: c.committed_at_ms)
    return out


def lockstep_round(env: dict[str, str], pipeline: Path, tables: list[str], log: Path, linger: float,
                   timeout: float = 300) -> dict[str, Any]:
    """Start `lockstep run`, wait for every table's first commit and ``linger`` s more, kill it."""
    from coordinator.settings import Settings

    settings = Settings.from_env(env)
    child = Child([sys.executable, "-m", "lockstep", "run", str(pipeline)], env, log)
    try:
        deadline = time.monotonic() + timeout
        firsts: dict[str, Any] = {}
        while len(firsts) < len(tables):
            if child.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"lockstep run did not commit every table (see {log})")
            time.sleep(0.5)
            firsts = first_commits(settings, tables, child.started_ms)
        time.sleep(linger)
        steady = first_commits(settings, tables, int(time.time() * 1000) - 1500)
        setups = {m.group(1): float(m.group(2)) for _, line in child.lines
                  if (m := re.search(r"job (\S+) committed barrier \d+, [\d.]+ s after it started \(setup ([\d.]+) s\)", line))}
        return {"session": child.said(SESSION_UP), "setup": setups,
                **{t: (c.committed_at_ms - child.started_ms) / 1000 for t, c in firsts.items()},
                "phases": {t: {p.name: p.ms for p in c.phases} for t, c in firsts.items()},
                "steady": {t: {p.name: p.ms for p in c.phases} for t, c in steady.items()}}
    finally:
        child.kill()


def plain_round(env: dict[str, str], tmp: Path, log: Path, linger: float, timeout: float = 300) -> dict[str, Any]:
    """Start the plain query's process, wait for its first batch written after the start, kill it."""
    child = Child([sys.executable, "-m", "bench.restart", "--plain-job", env["LOCKSTEP_BOOTSTRAP"], str(tmp / "plain_wh"),
                   str(tmp / "plain_ckpt")], env, log)
    try:
        deadline = time.monotonic() + timeout
        while child.said("committed batch") is None:
            if child.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the plain query did not write (see {log})")
            time.sleep(0.2)
        first = child.said("committed batch")
        time.sleep(linger)
        setups = {m.group(1): float(m.group(2)) for _, line in child.lines
                  if (m := re.search(r"job (\S+) committed barrier \d+, [\d.]+ s after it started \(setup ([\d.]+) s\)", line))}
        return {"session": child.said(SESSION_UP), "setup": setups, "events": first}
    finally:
        child.kill()


def folder_mb(folder: Path) -> float:
    """Size of the files under ``folder`` in MB (0 if it is missing)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):5.1f} s ({min(values):.1f}-{max(values):.1f})" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="restarts measured per system (default 4)")
    parser.add_argument("--rate", type=int, default=200, help="records/s fed while the jobs run and restart")
    parser.add_argument("--linger", type=float, default=5.0, help="seconds to keep running after the first commits")
    parser.add_argument("--keyed", action="store_true", help="also an aggregate kept in Spark's state store")
    parser.add_argument("--plain-job", nargs=3, metavar=("BOOTSTRAP", "WAREHOUSE", "CHECKPOINT"), help=argparse.SUPPRESS)
    add_json_flag(parser)
    args = parser.parse_args()
    if args.plain_job:
        plain_job(*args.plain_job)
        return
    figures = Figures("restart", args)
    from confluent_kafka.admin import AdminClient, NewTopic

    from coordinator.client.topics import create_topics
    from spark_jobs.planning.pipeline import parse_pipeline
    from spark_jobs.runtime.maintenance.keyed import STATE_FOLDER

    with tempfile.TemporaryDirectory() as name, stack(Path(name), "lockstep", 1000) as (env, _servers):
        tmp = Path(name)
        env = {**env, "LOCKSTEP_WAREHOUSE": str(tmp / "wh")}
        admin = AdminClient({"bootstrap.servers": env["LOCKSTEP_BOOTSTRAP"]})
        create_topics(admin, [NewTopic(TOPIC, 2, 1)])
        pipeline = tmp / "pipeline.sql"
        pipeline.write_text(PIPELINE.format(topic=TOPIC) + (KEYED if args.keyed else ""))
        tables = [job.sink for job in parse_pipeline(pipeline.read_text()).jobs]
        feed = Feed(env["LOCKSTEP_BOOTSTRAP"], args.rate)
        feed.start()
        lockstep_log, plain_log = tmp / "lockstep.log", tmp / "plain.log"
        print("first starts (tables and checkpoints made; not counted) ...", flush=True)
        lockstep_round(env, pipeline, tables, lockstep_log, args.linger)
        plain_round(env, tmp, plain_log, args.linger)
        rounds: dict[str, list[dict[str, Any]]] = {"lockstep": [], "plain": []}
        for i in range(args.rounds):
            rounds["lockstep"].append(lockstep_round(env, pipeline, tables, lockstep_log, args.linger))
            rounds["plain"].append(plain_round(env, tmp, plain_log, args.linger))
            shown = {k: v for k, v in rounds["lockstep"][-1].items() if k not in ("phases", "steady", "setup")}
            print(f"round {i + 1}: lockstep {json.dumps(shown)}; plain {json.dumps(rounds['plain'][-1])}", flush=True)
        feed.halt.set()
        state_mb = folder_mb(tmp / "wh" / "per_key_state" / STATE_FOLDER) if args.keyed else None
    ls, pl = rounds["lockstep"], rounds["plain"]
    print(f"\nrestart -> (median of {args.rounds}, min-max)   lockstep run             plain query")
    print(f"  Spark session up                 {spread([r['session'] for r in ls if r['session']]):24} "
          f"{spread([r['session'] for r in pl if r['session']])}")
    print(f"  first commit of events           {spread([r['events'] for r in ls]):24} {spread([r['events'] for r in pl])}")
    for table in tables[1:]:
        print(f"  {'first commit of ' + table:33}{spread([r[table] for r in ls]):24} -")
    for job in sorted({j for r in ls for j in r["setup"]}):
        print(f"  {job + ' setup (its tables)':33}{spread([r['setup'][job] for r in ls if job in r['setup']]):24} -")
    ratio = statistics.median(r["events"] for r in ls) / statistics.median(r["events"] for r in pl)
    print(f"  ratio lockstep / plain (events)  {ratio:.2f}")
    sessions = [r["session"] for r in ls if r["session"]]
    plain_sessions = [r["session"] for r in pl if r["session"]]
    if sessions:
        base = statistics.median(plain_sessions) if plain_sessions else None
        figures.add("Spark session up", statistics.median(sessions), "s", baseline=base,
                    ratio=statistics.median(sessions) / base if base else None, samples=sessions)
    figures.add("first commit of events", statistics.median(r["events"] for r in ls), "s",
                baseline=statistics.median(r["events"] for r in pl), ratio=ratio, samples=[r["events"] for r in ls])
    for table in tables[1:]:
        figures.add_median(f"first commit of {table}", [r[table] for r in ls], "s")
    if state_mb is not None:
        print(f"  per_key_state's state on disk    {state_mb:.3f} MB")
        figures.add("per_key_state's state on disk", state_mb, "MB")
    for job in sorted({j for r in ls for j in r["setup"]}):
        figures.add_median(f"{job} setup (its tables)", [r["setup"][job] for r in ls if job in r["setup"]], "s")
    for table in tables:
        phases = sorted({p for r in ls for p in r["phases"].get(table, {})})
        first = {p: statistics.median(r["phases"][table].get(p, 0) for r in ls if table in r["phases"]) for p in phases}
        steady = {p: statistics.median([r["steady"][table].get(p, 0) for r in ls if table in r["steady"]] or [0])
                  for p in phases}  # (0: the table did not commit in a round's last 1.5 s)
        print(f"  {table} first commit after a restart, ms by phase (a steady commit's in brackets): "
              + ", ".join(f"{p} {first[p]:.0f} ({steady[p]:.0f})" for p in phases))
        for p in phases:
            figures.add(f"first commit after a restart: {p}", first[p], "ms", table=table)
            figures.add(f"steady commit: {p}", steady[p], "ms", table=table)
    figures.write()


if __name__ == "__main__":
    main()
