"""Failover under load: two coordinator workers, the leader killed with SIGKILL while a bank
pipeline runs and is read. What does a takeover cost, and does anything else break?

The pipeline books transfers {"src", "dst", "amount"} into a root table and maintains two
aggregates from it independently: money out per source account and money in per destination
account. In any consistent snapshot the two totals are equal (the bank invariant); a read that
sees them differ saw two tables at different barriers. A reader checks it at read-committed
throughout. Each round kills the current leader (SIGKILL), waits for the standby to announce
barriers, and starts the killed worker again as the new standby.

It prints, per takeover: the time from the kill to the next barrier, the gap in barrier
announcements around the kill next to the median barrier spacing measured before the first kill
in the same run (the ratio; the gap also holds the wait for the jobs before the kill), whether barrier ids
stayed contiguous, where the gap goes (kill -> the standby reports itself leader, the Kafka
group's session timeout and rebalance; -> its first barrier), and the reads and anomalies during
(kill to +30 s). The reader knows both workers (LOCKSTEP_COORDINATOR_URL lists both), as a
client of a two-worker deployment should.
Issue 17's goal: a takeover costs < 30 s of barriers and nothing else.

Usage: python -m bench.failover [--rounds 3] [--rate 200] [--barrier-interval-ms 1000] [--settle-s 60]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.results import Figures, add_json_flag
from bench.stack import Processes, stack, wait_created

PIPELINE = """
CREATE TABLE transfers (src BIGINT, dst BIGINT, amount BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE paid AS SELECT src AS account, SUM(amount) AS total FROM transfers GROUP BY src;
CREATE TABLE received AS SELECT dst AS account, SUM(amount) AS total FROM transfers GROUP BY dst;
"""
TOPIC = "bank_transfers"


class Transfers(threading.Thread):
    """Books ``rate`` random transfers a second between 50 accounts."""

    def __init__(self, bootstrap: str, rate: int) -> None:
        from confluent_kafka import Producer

        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
        self.rate, self.halt, self.sent = rate, threading.Event(), 0
        self.rng = random.Random(11)

    def run(self) -> None:
        while not self.halt.is_set():
            for _ in range(max(1, self.rate // 20)):
                src, dst = self.rng.sample(range(50), 2)
                record = {"src": src, "dst": dst, "amount": self.rng.randrange(1, 100)}
                self.producer.produce(TOPIC, json.dumps(record).encode(), key=str(src).encode())
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.05)
        self.producer.flush(30)


class BankReader(threading.Thread):
    """Read-committed reads of ``paid`` and ``received``: (time, barrier, totals equal) each."""

    def __init__(self, settings: Any) -> None:
        super().__init__(daemon=True)
        self.settings, self.halt = settings, threading.Event()
        self.reads: list[tuple[float, int, bool]] = []
        self.failures = 0

    def run(self) -> None:
        from lockstep_reads import open_snapshot
        from spark_jobs.runtime.session import build_session

        spark = build_session("bank-reader", settings=self.settings)
        seen: dict[tuple[tuple[str, int | None], ...], bool] = {}
        while not self.halt.wait(0.2):
            try:
                with open_snapshot(["paid", "received"], settings=self.settings, spark=spark) as snap:
                    key = tuple(sorted(snap.versions.items()))
                    if key not in seen:
                        row = snap.sql("SELECT (SELECT SUM(total) FROM paid) AS paid, "
                                       "(SELECT SUM(total) FROM received) AS received").first()
                        seen[key] = row["paid"] == row["received"]
                    self.reads.append((time.time(), snap.barrier or 0, seen[key]))
            except Exception:  # noqa: BLE001 - a read the coordinator could not serve (mid-takeover) is counted
                self.failures += 1


def leader_of(workers: list[Any]) -> Any | None:
    from coordinator.client.rest import get_json
    from coordinator.settings import Settings

    for worker in workers:
        try:
            if get_json(Settings(coordinator_url=worker.url), "/health", timeout=2).get("leader"):
                return worker
        except Exception:  # noqa: BLE001 - a dead or starting worker leads nothing
            continue
    return None


def barrier_times(env: dict[str, str]) -> dict[int, int]:
    from coordinator.client.state import read_state
    from coordinator.settings import Settings

    return {b: a.ts_ms for b, a in read_state(Settings.from_env(env)).barriers.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="leader kills (default 3)")
    parser.add_argument("--rate", type=int, default=200, help="transfers/s (default 200)")
    parser.add_argument("--barrier-interval-ms", type=int, default=1000)
    parser.add_argument("--settle-s", type=float, default=60, help="seconds between kills (default 60)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home (logs)")
    add_json_flag(parser)
    args = parser.parse_args()
    figures = Figures("failover", args)
    from coordinator.settings import Settings
    from lockstep.dev.broker import free_port
    from lockstep.dev.worker import WorkerProcess
    from spark_jobs.demo.datagen import ensure_topic

    with ExitStack() as cleanup:
        tmp = Path(tempfile.mkdtemp(prefix="failover-"))
        if not args.keep:
            cleanup.callback(shutil.rmtree, tmp, True)
        env, (broker, first) = cleanup.enter_context(stack(tmp, "lockstep", args.barrier_interval_ms))
        port = free_port()
        second = WorkerProcess({**env, "LOCKSTEP_COORDINATOR_URL": f"http://127.0.0.1:{port}"}, port,
                               tmp / "worker-2.log").start()
        cleanup.callback(second.stop)
        workers = [first, second]
        settings = Settings.from_env({**env, "LOCKSTEP_COORDINATOR_URL": f"{first.url},{second.url}"})
        ensure_topic(settings, TOPIC, partitions=2)
        pipeline = tmp / "bank.sql"
        pipeline.write_text(PIPELINE.format(topic=TOPIC))
        procs = Processes()
        cleanup.callback(procs.stop_all)
        procs.start("jobs", [sys.executable, "-m", "lockstep", "run", str(pipeline)], env, tmp / "jobs.log")
        wait_created(env, ["paid", "received"], procs, tmp / "jobs.log")
        transfers = Transfers(broker.bootstrap, args.rate)
        transfers.start()
        cleanup.callback(transfers.halt.set)
        reader = BankReader(settings)
        reader.start()
        cleanup.callback(reader.halt.set)
        print(f"failover: {args.rounds} leader kills, {args.rate} transfers/s, barriers every "
              f">= {args.barrier_interval_ms} ms; logs in {tmp}", flush=True)
        time.sleep(args.settle_s)
        times = barrier_times(env)
        recent = sorted(t for t in times.values() if t >= (time.time() - args.settle_s) * 1000)
        baseline_s = statistics.median(b - a for a, b in zip(recent, recent[1:], strict=False)) / 1000
        kills: list[float] = []
        elected: list[float] = []
        for round_ in range(1, args.rounds + 1):
            leader = leader_of(workers)
            if leader is None:
                raise SystemExit("no worker leads; see the worker logs")
            killed_at = time.time()
            os.kill(leader.proc.pid, signal.SIGKILL)
            leader.proc.wait(10)
            kills.append(killed_at)
            while leader_of(workers) is None and time.time() < killed_at + args.settle_s:
                time.sleep(0.1)
            elected.append(time.time() - killed_at)
            print(f"  round {round_}: killed the leader on {leader.url}; the standby leads after "
                  f"{elected[-1]:.1f} s", flush=True)
            time.sleep(max(0.0, killed_at + args.settle_s - time.time()))
            leader.start()  # back as the standby
        reader.halt.set()
        reader.join(60)
        times = barrier_times(env)
        ids = sorted(times)
        contiguous = ids == list(range(ids[0], ids[-1] + 1))
        print(f"baseline: barriers {baseline_s:.2f} s apart (median over the {args.settle_s:.0f} s before the first kill)")
        print(f"{'takeover':>9}{'gap (s)':>10}{'gap / baseline':>16}{'kill -> barrier (s)':>21}{'election':>10}"
              f"{'-> barrier':>12}{'reads during':>14}{'anomalous':>11}")
        gaps, costs = [], []
        for n, (k, election) in enumerate(zip(kills, elected, strict=True), 1):
            before = max(t for t in times.values() if t <= k * 1000)
            after = min(t for t in times.values() if t > k * 1000)
            gap = (after - before) / 1000
            cost = after / 1000 - k
            gaps.append(gap)
            costs.append(cost)
            during = [r for r in reader.reads if k <= r[0] <= k + 30]
            anomalous = sum(not ok for *_, ok in during)
            print(f"{n:>9}{gap:10.1f}{gap / baseline_s:16.1f}{cost:21.1f}{election:10.1f}{cost - election:12.1f}"
                  f"{len(during):14}{anomalous:11}")
            figures.add("gap", gap, "s", baseline=baseline_s, ratio=gap / baseline_s, takeover=n)
            for name, value, unit in (("kill -> barrier", cost, "s"), ("election", election, "s"),
                                      ("-> barrier", cost - election, "s"), ("reads during", len(during), "reads"),
                                      ("anomalous", anomalous, "reads")):
                figures.add(name, value, unit, takeover=n)
        anomalies = sum(not ok for *_, ok in reader.reads)
        print(f"kill -> next barrier median {statistics.median(costs):.1f} s (min {min(costs):.1f}, max {max(costs):.1f}); "
              f"gap between barriers median {statistics.median(gaps):.1f} s (min {min(gaps):.1f}, max {max(gaps):.1f}); "
              f"barrier ids contiguous: {contiguous}; {len(reader.reads)} read-committed reads, {anomalies} anomalous, "
              f"{reader.failures} not served; {transfers.sent:,} transfers")
        figures.add_median("kill -> next barrier median", costs, "s")
        figures.add("gap between barriers median", statistics.median(gaps), "s", baseline=baseline_s,
                    ratio=statistics.median(gaps) / baseline_s, samples=gaps)
        for name, value, unit in (("barrier ids contiguous", contiguous, "bool"),
                                  ("read-committed reads", len(reader.reads), "reads"), ("anomalous reads", anomalies, "reads"),
                                  ("reads not served", reader.failures, "reads"), ("transfers", transfers.sent, "transfers")):
            figures.add(name, value, unit)
        figures.write()


if __name__ == "__main__":
    main()
