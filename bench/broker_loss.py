"""A broker lost under the barrier clock: on a 3-node KRaft cluster, one broker (never the active
controller) is killed with SIGKILL while end offsets are asked every 0.2 s, as the barrier clock
and the state readers ask them. How long until the ends answer again, and what does the wait cost?

The baseline is the cluster itself: the time from the kill until its metadata names a new
leader for every partition the dead broker led (the election; no client can answer before it).
The ratio is election / first answer (1.0: the ends answer the moment the cluster can).
The CPU is the asking process's (librdkafka's threads included) over the ``--window-s`` seconds
after the kill, next to the same window before it. Each round starts the killed node again.

Usage: python -m bench.broker_loss [--rounds 3] [--window-s 30]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import multiprocessing
import queue
import statistics
import sys
import tempfile
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from bench.results import Figures, add_json_flag

if TYPE_CHECKING:
    from lockstep.dev.broker import LocalKafkaCluster

TOPIC, PARTITIONS = "bench_broker_loss", 6


def ask_ends(bootstrap: str, answered: Queue[float], halt: EventType) -> None:
    """The asking process: every partition's end every 0.2 s, as the barrier clock asks it, each
    answer's time put on ``answered``. Its own process, so its CPU is the client's alone."""
    from confluent_kafka import KafkaException, TopicPartition

    from coordinator.client.offsets import EndOffsets
    from coordinator.settings import Settings

    offsets = EndOffsets(dataclasses.replace(Settings.from_env(), bootstrap=bootstrap))
    partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    while not halt.wait(0.2):
        with contextlib.suppress(KafkaException):  # a refusal after RETRY_S: the next ask is the measure
            offsets.latest(partitions, committed=True)
            answered.put(time.monotonic())
    offsets.close()


class Asker:
    """The asking process, its CPU seconds and the answers it gave so far."""

    def __init__(self, bootstrap: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.answered: Queue[float] = context.Queue()
        self.halt = context.Event()
        self.process = context.Process(target=ask_ends, args=(bootstrap, self.answered, self.halt), daemon=True)
        self.process.start()
        self.times: list[float] = []

    def cpu_s(self) -> float:
        used = psutil.Process(self.process.pid).cpu_times()
        return float(used.user + used.system)

    def answers(self) -> list[float]:
        with contextlib.suppress(queue.Empty):
            while True:
                self.times.append(self.answered.get_nowait())
        return self.times

    def stop(self) -> None:
        self.halt.set()
        self.process.join(30)


def leaders(bootstrap: str) -> dict[int, tuple[int, int]]:
    """partition -> (its leader, how many replicas are in sync)."""
    from confluent_kafka.admin import AdminClient

    topic = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(TOPIC, timeout=10).topics[TOPIC]
    return {p.id: (p.leader, len(p.isrs)) for p in topic.partitions.values()}


def led_by(bootstrap: str, node: int) -> set[int]:
    return {p for p, (leader, _) in leaders(bootstrap).items() if leader == node}


def balanced(bootstrap: str, timeout: float = 120.0) -> None:
    """Wait until every replica is in sync, then give each partition back to its preferred leader,
    so the node killed next leads its share (a restarted node leads nothing until then)."""
    from confluent_kafka import ElectionType, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    while any(isrs < 3 for _, isrs in leaders(bootstrap).values()):
        if time.monotonic() > deadline:
            raise SystemExit(f"replicas of {TOPIC} were not all in sync {timeout:.0f} s after the restart")
        time.sleep(0.5)
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    with contextlib.suppress(KafkaException):  # ELECTION_NOT_NEEDED: already the preferred leaders
        admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]).result(30)
    while len({leader for leader, _ in leaders(bootstrap).values()}) < 3:
        if time.monotonic() > deadline:
            raise SystemExit(f"{TOPIC}'s leaders did not spread over the 3 nodes within {timeout:.0f} s")
        time.sleep(0.5)


def elected(bootstrap: str, node: int, killed_at: float, timeout: float = 120.0) -> float:
    """Seconds from ``killed_at`` until no partition of the topic is led by ``node``."""
    while time.monotonic() - killed_at < timeout:
        try:
            if not led_by(bootstrap, node):
                return time.monotonic() - killed_at
        except Exception:  # noqa: BLE001 - a metadata request to the dead node fails; ask again
            pass
        time.sleep(0.1)
    raise SystemExit(f"the cluster elected no new leader within {timeout:.0f} s of the kill")


def one_round(cluster: LocalKafkaCluster, asker: Asker, window_s: float) -> dict[str, float]:
    bootstrap = cluster.bootstrap
    balanced(bootstrap)
    controller = cluster.controller_id()
    victim = next(n for n in cluster.node_ids if n != controller)
    before = asker.cpu_s()
    time.sleep(window_s)
    idle_cpu = asker.cpu_s() - before
    answers_before = len(asker.answers())
    before, killed_at = asker.cpu_s(), time.monotonic()
    cluster.kill(victim)
    election = elected(bootstrap, victim, killed_at)
    while time.monotonic() - killed_at < window_s:
        time.sleep(0.1)
    lost_cpu = asker.cpu_s() - before
    after = [t for t in asker.answers()[answers_before:] if t > killed_at]
    if not after:
        raise SystemExit(f"the ends did not answer within {window_s:.0f} s of the kill: raise --window-s")
    first = after[0] - killed_at
    print(f"  killed node {victim}: election {election:.2f} s, first answer {first:.2f} s; "
          f"CPU {lost_cpu:.2f} s in the {window_s:.0f} s after the kill, {idle_cpu:.2f} s in the same before", flush=True)
    cluster.node(victim).up()
    return {"election": election, "first": first, "cpu_after": lost_cpu, "cpu_before": idle_cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="brokers killed, one a round (default 3)")
    parser.add_argument("--window-s", type=float, default=30.0, help="seconds measured before and after each kill (default 30)")
    add_json_flag(parser)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.window_s < 5:
        parser.error("--rounds must be at least 1 and --window-s at least 5")

    from confluent_kafka.admin import AdminClient, NewTopic

    from coordinator.client.topics import create_topics
    from coordinator.settings import Settings
    from lockstep.dev.broker import LocalKafkaCluster
    from lockstep.dev.service import free_port

    settings = Settings.from_env()
    ports: list[int] = []
    for _ in range(3):
        ports.append(free_port(exclude=frozenset(ports)))
    with tempfile.TemporaryDirectory(prefix="lockstep-broker-loss-") as home:
        kafka = LocalKafkaCluster(Path(home) / "kafka", settings.jars / "kafka", ports)
        started = time.monotonic()
        kafka.up()
        try:
            print(f"3-node cluster up in {time.monotonic() - started:.1f} s", flush=True)
            create_topics(AdminClient({"bootstrap.servers": kafka.bootstrap, "log_level": 0}),
                          [NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "2"})])
            asker = Asker(kafka.bootstrap)
            try:
                rounds = [one_round(kafka, asker, args.window_s) for _ in range(args.rounds)]
            finally:
                asker.stop()
        finally:
            kafka.down()

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    def spread(key: str) -> str:
        return f"{min(r[key] for r in rounds):.2f}-{max(r[key] for r in rounds):.2f}"

    print(f"\nkill -> first end-offsets answer: median {median('first'):.2f} s ({spread('first')}), "
          f"election {median('election'):.2f} s ({spread('election')}): ratio {median('election') / median('first'):.2f}")
    print(f"CPU in the {args.window_s:.0f} s after a kill: median {median('cpu_after'):.2f} s ({spread('cpu_after')}), "
          f"before it {median('cpu_before'):.2f} s ({spread('cpu_before')})")
    print(f"where the time goes: the election {median('election'):.2f} s, then "
          f"{median('first') - median('election'):.2f} s until the next ask got through")
    figures = Figures("broker_loss", args)
    figures.add("kill to first end-offsets answer", median("first"), "s", baseline=median("election"),
                ratio=median("election") / median("first"), samples=[r["first"] for r in rounds])
    figures.add("CPU after a kill", median("cpu_after"), "s", baseline=median("cpu_before"),
                samples=[r["cpu_after"] for r in rounds], window_s=args.window_s)
    figures.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
