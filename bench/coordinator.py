"""Coordinator benchmarks: fold throughput, replay of 1M events, /snapshot latency, command round
trip, the leader's fenced barrier write (announce), how the state's costs grow over simulated
time with pruning (retention), and with the topology's size (topology: 3 tables against 100).

Usage: python -m bench.coordinator {fold,replay,snapshot,commands,announce,retention,topology} [--events N] [--requests N]
       [--barriers N] [--tables N] [--retain N]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.coordinator_scale import bench_retention, bench_topology
from bench.results import Figures, add_json_flag
from bench.stack import start_broker
from coordinator.codec import default_codec
from coordinator.domain import BarrierAnnounced, BarrierCompleted, JobState, TableState, entity_key, fold_all
from coordinator.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def events(n: int, tables: int = 20, seed: int = 1) -> list[object]:
    """A realistic mix: tables and jobs, then barriers and one completion per table per barrier."""
    rng = random.Random(seed)
    out: list[object] = [TableState(f"t{i}", "root") for i in range(tables)]
    out += [JobState(f"j{i}", f"t{i}", external_topics=("src",)) for i in range(tables)]
    b = 0
    while len(out) < n:
        b += 1
        out.append(BarrierAnnounced(b, b * 1000))
        for i in range(tables):
            out.append(
                BarrierCompleted(f"j{i}", f"t{i}", b, 0, b, rows_in=rng.randint(0, 100), committed_at_ms=b * 1000 + 300)
            )
    return out[:n]


def bench_fold(n: int, figures: Figures) -> None:
    evs = events(n)
    t0 = time.perf_counter()
    baseline: dict[str, object] = {}
    for e in evs:
        baseline[entity_key(e)] = e  # the cheapest possible "latest value per key"
    base_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    state = fold_all(evs)
    fold_s = time.perf_counter() - t0
    codec = default_codec()
    encoded = [codec.encode(e) for e in evs[: n // 10]]
    t0 = time.perf_counter()
    for data in encoded:
        codec.decode(data)
    decode_s = (time.perf_counter() - t0) * 10
    print(f"events: {n}")
    print(f"baseline dict[key] = event : {n / base_s:12,.0f} events/s")
    print(f"fold                       : {n / fold_s:12,.0f} events/s  (ratio to baseline {base_s / fold_s:.2f})")
    both = fold_s + decode_s
    print(f"decode + fold              : {n / both:12,.0f} events/s  (ratio to baseline {base_s / both:.2f})")
    print(f"state hash {state.state_hash()[:16]}")
    for name, spent in (("fold events/s", fold_s), ("decode + fold events/s", both)):
        figures.add(name, n / spent, "events/s", baseline=n / base_s, ratio=base_s / spent, subcommand="fold", events=n)


def bench_replay(n: int, figures: Figures) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    from coordinator.client.state import StateReader
    from coordinator.client.topics import Topics, ensure_topics

    with tempfile.TemporaryDirectory() as tmp:
        broker = start_broker(Path(tmp))
        try:
            settings = replace(Settings.from_env({}), bootstrap=broker.bootstrap)
            topics = Topics(f"bench{uuid.uuid4().hex[:6]}")
            ensure_topics(settings, topics)
            codec = default_codec()
            producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50, "batch.size": 1_000_000})
            t0 = time.perf_counter()
            for i, e in enumerate(events(n)):
                topic = topics.completions if isinstance(e, BarrierCompleted) else (
                    topics.barriers if isinstance(e, BarrierAnnounced) else topics.registry)
                while True:
                    try:
                        producer.produce(topic, key=entity_key(e).encode(), value=codec.encode(e))
                        break
                    except BufferError:
                        producer.poll(0.05)
                if i % 10000 == 0:
                    producer.poll(0)
            producer.flush(120)
            print(f"produced {n} events in {time.perf_counter() - t0:.1f}s")

            consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "raw", "enable.auto.commit": False})
            consumer.assign([TopicPartition(t, 0, OFFSET_BEGINNING) for t in topics.state])
            t0 = time.perf_counter()
            seen = 0
            while seen < n:
                seen += len(consumer.consume(5000, 1.0))
            raw_s = time.perf_counter() - t0
            consumer.close()

            reader = StateReader(settings, topics)
            t0 = time.perf_counter()
            state = reader.read_to_end(timeout=600)
            replay_s = time.perf_counter() - t0
            reader.close()
            print(f"raw consume of {n} records : {raw_s:6.1f}s")
            print(f"replay (decode + fold)       : {replay_s:6.1f}s  ({n / replay_s:,.0f} events/s, "
                  f"{replay_s / raw_s:.2f}x the raw consume)  folded {reader.stats.events_folded}, "
                  f"hash {state.state_hash()[:16]}")
            figures.add("replay s", replay_s, "s", baseline=raw_s, ratio=replay_s / raw_s, subcommand="replay", events=n)
            figures.add("replay events/s", n / replay_s, "events/s", subcommand="replay", events=n)
        finally:
            broker.down()


@contextmanager
def running_worker() -> Iterator[tuple[Settings, str]]:
    """A local broker and one coordinator worker in a temporary home: (settings, REST base URL)."""
    from lockstep.dev.broker import free_port

    with tempfile.TemporaryDirectory() as tmp:
        broker = start_broker(Path(tmp))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = {**os.environ, "LOCKSTEP_BOOTSTRAP": broker.bootstrap, "LOCKSTEP_HOME": tmp,
               "LOCKSTEP_TOPIC_PREFIX": "bench", "LOCKSTEP_COORDINATOR_URL": base}
        log = open(Path(tmp) / "worker.log", "wb")
        worker = subprocess.Popen([sys.executable, "-m", "lockstep", "worker", "--loglevel", "warn"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(base + "/health", timeout=2).read()
                    break
                except OSError as exc:
                    if worker.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"worker did not start:\n{(Path(tmp) / 'worker.log').read_text()[-3000:]}") from exc
                    time.sleep(0.3)
            yield Settings.from_env(env), base
        finally:
            worker.terminate()
            worker.wait(20)
            broker.down()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def add_percentiles(figures: Figures, name: str, xs: list[float], base: list[float] | None = None, **context: Any) -> None:
    """``name`` p50 (with its samples, and against ``base``'s p50 with the ratio of medians as printed) and p99, in ms."""
    figures.add(f"{name} p50", pct(xs, .5), "ms", baseline=pct(base, .5) if base else None,
                ratio=statistics.median(xs) / statistics.median(base) if base else None, samples=xs, **context)
    figures.add(f"{name} p99", pct(xs, .99), "ms", **context)


def bench_commands(requests: int, figures: Figures) -> None:
    """Command round trip (DeclareTable, then RegisterJob of a job writing it: each accepted,
    its fact written and folded, then its outcome read) against a baseline of one Kafka hop:
    produce a record and read it back with the same client library."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from coordinator.client.commands import CommandClient, new_request_id
    from coordinator.client.topics import create_topics
    from coordinator.domain import DeclareTable, RegisterJob

    with running_worker() as (settings, _):
        admin = AdminClient(settings.kafka_config())
        create_topics(admin, [NewTopic("bench.echo", 1, 1)])
        producer = Producer(settings.kafka_config({"linger.ms": 0}))
        consumer = Consumer(settings.kafka_config({"group.id": "bench-echo", "log_level": 3}))
        producer.produce("bench.echo", b"warm-up")
        producer.flush(10)
        consumer.assign([TopicPartition("bench.echo", 0, 1)])
        hop = []
        for i in range(requests):
            t0 = time.perf_counter()
            producer.produce("bench.echo", str(i).encode())
            producer.flush(10)
            while consumer.poll(5) is None:
                pass
            hop.append((time.perf_counter() - t0) * 1000)
        client = CommandClient(settings)
        declare, register = [], []
        for i in range(requests):
            t0 = time.perf_counter()
            declared = client.emit(DeclareTable(new_request_id(), f"bench_{i}", "root"))
            t1 = time.perf_counter()
            registered = client.emit(RegisterJob(new_request_id(), f"bench_job_{i}", f"bench_{i}", external_topics=("src",)))
            assert declared.accepted and registered.accepted, (declared.reason, registered.reason)
            declare.append((t1 - t0) * 1000)
            register.append((time.perf_counter() - t1) * 1000)
        client.close()
        consumer.close()
        print(f"{requests} of each")
        print(f"one Kafka hop (produce, read back)  p50 {pct(hop, .5):7.2f} ms  p99 {pct(hop, .99):7.2f} ms")
        add_percentiles(figures, "one Kafka hop", hop, subcommand="commands", requests=requests)
        for name, xs in (("DeclareTable round trip", declare), ("RegisterJob round trip", register)):
            print(f"{name:35s} p50 {pct(xs, .5):7.2f} ms  p99 {pct(xs, .99):7.2f} ms  "
                  f"(p50 ratio to one hop {statistics.median(xs) / statistics.median(hop):.1f})")
            add_percentiles(figures, name, xs, hop, subcommand="commands", requests=requests)


def bench_announce(requests: int, figures: Figures) -> None:
    """The leader's barrier write as the barrier clock does it (fenced: one Kafka transaction,
    ``coordinator.stream.fencing``) against the baseline of the same write with the plain
    idempotent producer every leader used before fencing; both wait until the worker's own state
    follower has folded the barrier, and the fenced one is split into its transaction and that
    wait (where the time goes)."""
    from coordinator.client.topics import Topics, ensure_topics
    from coordinator.stream.coordinator import Coordinator

    with tempfile.TemporaryDirectory() as tmp:
        broker = start_broker(Path(tmp))
        try:
            settings = Settings(bootstrap=broker.bootstrap, topic_prefix=f"bench{uuid.uuid4().hex[:6]}")
            topics = Topics(settings.topic_prefix)
            ensure_topics(settings, topics)
            coordinator = Coordinator(settings, topics)
            coordinator.start()
            codec = default_codec()
            plain, transaction, folded = [], [], []
            for i in range(requests):
                barrier = BarrierAnnounced(2 * i + 1, int(time.time() * 1000))
                t0 = time.perf_counter()
                coordinator.write([barrier])
                plain.append((time.perf_counter() - t0) * 1000)
                barrier = BarrierAnnounced(2 * i + 2, int(time.time() * 1000))
                t0 = time.perf_counter()
                marks = coordinator.leader_writer.write([(topics.barriers, entity_key(barrier).encode(),
                                                          codec.encode(barrier))])
                t1 = time.perf_counter()
                coordinator.follower.wait_for(marks)
                transaction.append((t1 - t0) * 1000)
                folded.append((time.perf_counter() - t1) * 1000)
            coordinator.stop()
        finally:
            broker.down()
    fenced = [a + b for a, b in zip(transaction, folded, strict=True)]
    print(f"{requests} barriers each way (interleaved)")
    print(f"plain write + fold (before)   p50 {pct(plain, .5):6.2f} ms  p99 {pct(plain, .99):6.2f} ms")
    print(f"fenced write + fold (after)   p50 {pct(fenced, .5):6.2f} ms  p99 {pct(fenced, .99):6.2f} ms  "
          f"(p50 ratio {statistics.median(fenced) / statistics.median(plain):.1f})")
    print(f"  of which the transaction    p50 {pct(transaction, .5):6.2f} ms  p99 {pct(transaction, .99):6.2f} ms")
    print(f"  of which the fold wait      p50 {pct(folded, .5):6.2f} ms  p99 {pct(folded, .99):6.2f} ms")
    for name, xs, base in (("plain write + fold", plain, None), ("fenced write + fold", fenced, plain),
                           ("of which the transaction", transaction, None), ("of which the fold wait", folded, None)):
        add_percentiles(figures, name, xs, base, subcommand="announce", barriers=requests)


def bench_snapshot(requests: int, figures: Figures) -> None:
    """/snapshot latency against /health on the same worker, 20 tables x 500 barriers of completions."""
    from confluent_kafka import Producer

    with running_worker() as (settings, base):
        codec = default_codec()
        producer = Producer({"bootstrap.servers": settings.bootstrap, "linger.ms": 20})
        evs = events(10_040)
        for e in evs:
            if isinstance(e, BarrierAnnounced):
                continue  # the worker's own clock announces barriers
            topic = {TableState: "bench.registry", JobState: "bench.registry", BarrierCompleted: "bench.completions"}[type(e)]
            producer.produce(topic, key=entity_key(e).encode(), value=codec.encode(e))
        producer.flush(30)
        time.sleep(3)
        tables = ",".join(f"t{i}" for i in range(5))

        def timed(path: str) -> list[float]:
            out = []
            for _ in range(requests):
                t0 = time.perf_counter()
                urllib.request.urlopen(base + path, timeout=5).read()
                out.append((time.perf_counter() - t0) * 1000)
            return out

        health = timed("/health")
        snap = timed(f"/snapshot?tables={tables}")
        print(f"{requests} requests each, state of {len(evs)} events (5 of 20 tables per snapshot)")
        print(f"/health   p50 {pct(health, .5):6.2f} ms  p99 {pct(health, .99):6.2f} ms")
        print(f"/snapshot p50 {pct(snap, .5):6.2f} ms  p99 {pct(snap, .99):6.2f} ms  "
              f"(p50 ratio to /health {statistics.median(snap) / statistics.median(health):.2f})")
        for name, xs, base in (("/health", health, None), ("/snapshot", snap, health)):
            add_percentiles(figures, name, xs, base, subcommand="snapshot", requests=requests, events=len(evs), tables="5 of 20")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["fold", "replay", "snapshot", "commands", "announce", "retention", "topology"])
    parser.add_argument("--events", type=int, default=1_000_000, help="events for fold/replay (default 1,000,000)")
    parser.add_argument("--requests", type=int, default=2000, help="requests for snapshot (default 2000) and commands")
    parser.add_argument("--barriers", type=int, default=604_800, help="retention: simulated barriers (a week at 1/s)")
    parser.add_argument("--tables", type=int, default=10, help="retention: tables (default 10)")
    parser.add_argument("--retain", type=int, default=100, help="retention: LOCKSTEP_RETAIN_BARRIERS (default 100)")
    add_json_flag(parser)
    args = parser.parse_args()
    figures = Figures("coordinator", args)
    {"fold": lambda: bench_fold(args.events, figures), "replay": lambda: bench_replay(args.events, figures),
     "snapshot": lambda: bench_snapshot(args.requests, figures), "commands": lambda: bench_commands(args.requests, figures),
     "announce": lambda: bench_announce(args.requests, figures),
     "retention": lambda: bench_retention(args.barriers, args.tables, args.retain, figures),
     "topology": lambda: bench_topology(min(args.barriers, 2000), args.retain, figures)}[args.which]()
    figures.write()


if __name__ == "__main__":
    main()
