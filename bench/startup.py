"""Starts under load: `lockstep run` of a root table and two GROUP BY aggregates, started again
and again on fresh topic prefixes and warehouses while a producer keeps ``--rate`` JSON records
a second flowing (the drill of tests/drills/test_start_under_load.py, more times).

Each start counts once a read-committed snapshot of both aggregates resolves within 120 s of
`lockstep run`'s start; the jobs run on for ``--linger`` seconds, in which a read of a newer
barrier must come (within 30 s: no job stalled after its first commits); then the process gets
SIGTERM and must exit 143 within 30 s with no stack trace in its output. Printed: how many
starts passed, and per milestone (Spark session up, each table's first commit, the read, the
stop) median, min and max; the baseline in the same run is the time to a bare Spark session with
the same settings and jars (`--baseline-rounds` of them), so the ratio says what Lockstep adds to
the start itself.

Usage: python -m bench.startup [--starts 20] [--rate 5000] [--linger 20] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.results import Figures, add_json_flag
from bench.stack import stack
from tests.support.starts import AGGREGATES, LoadFeed, StartResult, start_once

ROOT = Path(__file__).resolve().parents[1]
BARE_SESSION = ("from spark_jobs.runtime.session import build_session; import time; t = time.monotonic(); "
                "build_session('bare'); print(f'{time.monotonic() - t:.2f}')")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f} s ({min(values):.1f}-{max(values):.1f}, n={len(values)})" if values else "-"


def bare_session(env: dict[str, str]) -> float:
    """Seconds from a Python process's start to a SparkSession with Lockstep's settings (the baseline)."""
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", BARE_SESSION], env=env, cwd=ROOT, check=True, capture_output=True)
    return time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=20, help="starts in a row (default 20)")
    parser.add_argument("--rate", type=int, default=5000, help="records/s produced throughout (default 5000)")
    parser.add_argument("--linger", type=float, default=20.0,
                        help="seconds each start keeps running after its first read; a newer barrier's read must "
                             "come within 30 s of it (default 20)")
    parser.add_argument("--baseline-rounds", type=int, default=3, help="bare Spark sessions timed (default 3)")
    parser.add_argument("--keep", action="store_true", help="keep the logs and data (their folder is printed)")
    add_json_flag(parser)
    args = parser.parse_args()
    figures = Figures("startup", args)
    tmp = Path(tempfile.mkdtemp(prefix="startup-"))
    results: list[StartResult] = []
    try:
        with stack(tmp, "plain", None) as (env, _servers):
            env = {k: v for k, v in env.items() if k != "LOCKSTEP_SPARK_LOG_LEVEL"}  # what a user sees
            feed = LoadFeed(env["LOCKSTEP_BOOTSTRAP"], args.rate)
            feed.start()
            try:
                for i in range(1, args.starts + 1):
                    result = start_once(env, tmp / f"start-{i}", feed, i, args.linger)
                    results.append(result)
                    status = "ok" if not result.problems() else "FAILED: " + "; ".join(result.problems())
                    print(f"start {i:2}: read after {result.read_s or 0:5.1f} s, stopped in {result.stop_s or 0:4.1f} s "
                          f"(exit {result.exit_code}), {result.lines} output lines; {status} "
                          f"[feed {feed.rate_so_far():,.0f}/s]", flush=True)
                baseline = [bare_session(env) for _ in range(args.baseline_rounds)]
            finally:
                feed.stop()
    finally:
        if args.keep:
            print(f"logs and data in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    passed = [r for r in results if not r.problems()]
    print(f"\n{len(passed)} of {len(results)} starts passed (read-committed read of {', '.join(AGGREGATES)} within 120 s; "
          "SIGTERM -> exit 143 within 30 s, no stack trace)")
    figures.add("starts passed", len(passed), "starts", starts=len(results))
    print("from `lockstep run`'s start (median, min-max):")
    sessions = [r.session_s for r in results if r.session_s is not None]
    print(f"  Spark session up             {spread(sessions)}")
    figures.add_median("Spark session up", sessions, "s")
    for table in ("x", *AGGREGATES):
        commits = [r.first_commits_s[table] for r in results if table in r.first_commits_s]
        print(f"  first commit of {table:12} {spread(commits)}")
        figures.add_median(f"first commit of {table}", commits, "s")
    reads = [r.read_s for r in results if r.read_s is not None]
    print(f"  read-committed read          {spread(reads)}")
    if reads:
        base = statistics.median(baseline) if baseline else None
        figures.add("read-committed read", statistics.median(reads), "s", baseline=base,
                    ratio=statistics.median(reads) / base if base else None, samples=reads)
    stops = [r.stop_s for r in results if r.stop_s is not None]
    print(f"  SIGTERM -> exit              {spread(stops)}")
    figures.add_median("SIGTERM -> exit", stops, "s")
    print(f"  output lines per start       {statistics.median([r.lines for r in results]) if results else 0:.0f}")
    figures.add_median("output lines per start", [r.lines for r in results], "lines")
    print(f"baseline: a bare Spark session {spread(baseline)}")
    figures.add_median("bare Spark session", baseline, "s")
    if reads and baseline:
        print(f"ratio read-committed read / bare session: {statistics.median(reads) / statistics.median(baseline):.1f}")
    for r in results:
        for problem in r.problems():
            print(f"  {problem}")
    figures.write()
    sys.exit(0 if len(passed) == len(results) else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
