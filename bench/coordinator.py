"""Coordinator benchmarks: fold throughput, replay of 1M events, /snapshot latency, command round
trip, the leader's fenced barrier write (announce), how the state's costs grow over simulated
time with pruning (retention), and with the topology's size (topology: 3 tables against 100).

Usage: python -m bench.coordinator {fold,replay,snapshot,commands,announce,retention,topology} [--events N] [--requests N]
       [--barriers N] [--tables N] [--retain N]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
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
from typing import TYPE_CHECKING

from coordinator.codec import default_codec
from coordinator.domain import BarrierAnnounced, BarrierCompleted, JobState, TableState, entity_key, fold_all
from coordinator.settings import Settings

if TYPE_CHECKING:
    from coordinator.dev.broker import LocalBroker

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


def bench_fold(n: int) -> None:
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


def start_broker(tmp: Path) -> LocalBroker:
    from coordinator.dev.broker import LocalBroker, free_port

    broker = LocalBroker(tmp / "kafka", ROOT / ".lockstep/jars/kafka", port=free_port(), heap="1g")
    broker.up()
    return broker


def bench_replay(n: int) -> None:
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
        finally:
            broker.down()


@contextmanager
def running_worker() -> Iterator[tuple[Settings, str]]:
    """A local broker and one coordinator worker in a temporary home: (settings, REST base URL)."""
    from coordinator.dev.broker import free_port

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


def bench_commands(requests: int) -> None:
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
        for name, xs in (("DeclareTable round trip", declare), ("RegisterJob round trip", register)):
            print(f"{name:35s} p50 {pct(xs, .5):7.2f} ms  p99 {pct(xs, .99):7.2f} ms  "
                  f"(p50 ratio to one hop {statistics.median(xs) / statistics.median(hop):.1f})")


def bench_announce(requests: int) -> None:
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


def bench_snapshot(requests: int) -> None:
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


def bench_retention(barriers: int, tables: int, retain: int) -> None:
    """Fold a simulated run (a barrier a second, a completion per table per barrier, the leader
    pruning every 5 s) and measure, after one simulated hour and at the end: state records, the
    replay (fold of every record), a barrier tick (plan_barrier) and a read-committed /snapshot
    resolution. The hour is the baseline the end is compared with; without pruning, the hour's
    figures are printed too."""
    from coordinator.domain import MetaState, fold
    from coordinator.domain.barriers import BarrierConfig, plan_barrier
    from coordinator.domain.events import CutEntry
    from coordinator.domain.pruning import prunable
    from coordinator.domain.snapshot import resolve_snapshot

    names = [f"t{i}" for i in range(tables)]
    config = BarrierConfig(interval_ms=1000, max_inflight=10**9)

    def measure(state: MetaState) -> dict[str, float]:
        records = [*state.tables.values(), *state.jobs.values(), *state.barriers.values(),
                   *(c for by_b in state.completions.values() for c in by_b.values())]
        replay = []
        for _ in range(3):
            t0 = time.perf_counter()
            fold_all(records)
            replay.append(time.perf_counter() - t0)
        now = state.last_barrier() * 1000 + 1000
        cut = [CutEntry("src", 0, state.last_barrier())]
        tick, snap = [], []
        for _ in range(200):
            t0 = time.perf_counter()
            plan_barrier(state, now, cut, config)
            t1 = time.perf_counter()
            resolve_snapshot(state, names)
            t2 = time.perf_counter()
            tick.append(t1 - t0)
            snap.append(t2 - t1)
        return {"records": state.records(), "replay_ms": statistics.median(replay) * 1000,
                "tick_ms": statistics.median(tick) * 1000, "snapshot_ms": statistics.median(snap) * 1000}

    def simulate(until: int, prune: bool, marks: set[int]) -> dict[int, dict[str, float]]:
        state = fold_all([TableState(t, "root") for t in names] +
                         [JobState(f"j_{t}", t, external_topics=("src",)) for t in names])
        out: dict[int, dict[str, float]] = {}
        started = time.perf_counter()
        for b in range(1, until + 1):
            state = fold(state, BarrierAnnounced(b, b * 1000, (CutEntry("src", 0, b),)))
            for t in names:
                state = fold(state, BarrierCompleted(f"j_{t}", t, b, 0, b, committed_at_ms=b * 1000 + 300))
            if prune and b % 5 == 0:
                for tombstone in prunable(state, retain):
                    state = fold(state, tombstone)
            if b in marks:
                out[b] = measure(state)
                print(f"  {'pruned' if prune else 'unpruned'} barrier {b:>9,}: {out[b]['records']:>9,.0f} records, "
                      f"simulated in {time.perf_counter() - started:6.1f} s", flush=True)
        return out

    hour = min(3600, barriers)
    print(f"simulating {barriers:,} barriers x {tables} tables, retention {retain} barriers")
    unpruned = simulate(hour, prune=False, marks={hour})[hour]
    pruned = simulate(barriers, prune=True, marks={hour, barriers})
    base, end = pruned[hour], pruned[barriers]
    print(f"{'':24}{'1 h, unpruned':>16}{'1 h, pruned':>14}{'end, pruned':>14}{'end / 1 h':>11}")
    for key, label in (("records", "state records"), ("replay_ms", "replay (ms)"), ("tick_ms", "barrier tick (ms)"),
                       ("snapshot_ms", "/snapshot resolve (ms)")):
        print(f"{label:24}{unpruned[key]:16,.3f}{base[key]:14,.3f}{end[key]:14,.3f}{end[key] / base[key]:11.2f}")


def bench_topology(barriers: int, retain: int) -> None:
    """Coordination cost against topology size: the shopping shape (1 root, 2 aggregates: the
    baseline) and 100 tables with 100 jobs (10 roots, each feeding 9 derived tables), folded
    through ``barriers`` barriers with every table committing each one (source versions on the
    derived ones) and pruning every 5 barriers. Then 30 more barriers as the leader lives them:
    each barrier announced, every job's completion folded, and the leader's tick every 50 ms
    replanning whenever facts arrived since the last tick, as the worker does: with the
    ``Pacer`` the leader keeps (what changed replanned), and from scratch (``next_due``, the
    baseline in the same run); plus the announcement (``plan_barrier``) and a read-committed
    ``/snapshot`` of two tables (the same query in both) and of every table, medians of 300, and
    the live page's ``/overview`` (median of 20)."""
    from coordinator.domain import MetaState, fold
    from coordinator.domain.barriers import BarrierConfig, next_due, plan_barrier
    from coordinator.domain.events import CutEntry, SourceVersion
    from coordinator.domain.pacer import Pacer
    from coordinator.domain.pruning import prunable
    from coordinator.domain.snapshot import resolve_snapshot
    from coordinator.stream import views

    config = BarrierConfig(interval_ms=1000, max_inflight=10**9)
    ticks_per_barrier = 20  # a 50 ms tick, 1 s barriers

    def shape(roots: int, per_root: int) -> dict[str, str | None]:
        """table -> its source (None for a root), every source before its readers."""
        out: dict[str, str | None] = {}
        for r in range(roots):
            out[f"root{r}"] = None
            out |= {f"root{r}_d{d}": f"root{r}" for d in range(per_root)}
        return out

    def barrier_facts(tables: dict[str, str | None], topics: list[str], b: int) -> list[object]:
        """Barrier ``b``'s announcement and every table's completion (roots committed 300 ms after
        it, derived tables 300 ms after their root), in the order they happen."""
        facts: list[object] = [BarrierAnnounced(b, b * 1000, tuple(CutEntry(topic, 0, b) for topic in topics))]
        for t, src in tables.items():
            start = b * 1000 + (50 if src is None else 350)
            facts.append(BarrierCompleted(f"j_{t}", t, b, 0, b, started_at_ms=start, committed_at_ms=start + 250,
                                          source_versions=(SourceVersion(src, b),) if src is not None else ()))
        return facts

    def measure(tables: dict[str, str | None], pacer: Pacer | None, profile: cProfile.Profile | None = None) -> dict[str, float]:
        names = list(tables)
        topics = sorted({f"src{t}" for t, source in tables.items() if source is None})
        state: MetaState = fold_all(
            [TableState(t, "root" if src is None else "intermediate") for t, src in tables.items()] +
            [JobState(f"j_{t}", t, external_topics=(f"src{t}",)) if src is None else
             JobState(f"j_{t}", t, sources=(src,)) for t, src in tables.items()])
        for b in range(1, barriers + 1):
            state = fold_all(barrier_facts(tables, topics, b), state)  # type: ignore[arg-type]
            if b % 5 == 0:
                for tombstone in prunable(state, retain):
                    state = fold(state, tombstone)
        replans: list[float] = []
        folded = 0  # facts that arrived before a replan
        announces: list[float] = []
        per_barrier: list[float] = []
        for b in range(barriers + 1, barriers + 31):
            facts = barrier_facts(tables, topics, b)
            spent = 0.0
            for tick in range(ticks_per_barrier):
                arrived = facts[len(facts) * tick // ticks_per_barrier:len(facts) * (tick + 1) // ticks_per_barrier]
                if not arrived:
                    continue  # nothing new: the worker does not replan
                state = fold_all(arrived, state)  # type: ignore[arg-type]
                folded += len(arrived)
                t0 = time.perf_counter()
                if pacer is None:
                    next_due(state, b * 1000 + tick * 50, config)
                elif profile is None:
                    pacer.next_due(state, b * 1000 + tick * 50)
                else:  # a run to see where the time goes (its timings are not reported)
                    profile.runcall(pacer.next_due, state, b * 1000 + tick * 50)
                replans.append(time.perf_counter() - t0)
                spent += replans[-1]
            t0 = time.perf_counter()
            cut = [CutEntry(topic, 0, b + 1) for topic in topics]
            if pacer is None:
                plan_barrier(state, b * 1000 + 1000, cut, config)
            else:
                pacer.plan_barrier(state, b * 1000 + 1000, cut)
            announces.append(time.perf_counter() - t0)
            per_barrier.append(spent + announces[-1])
        pair = [names[0], names[1]]
        timings: dict[str, list[float]] = {"pair": [], "all": []}
        for _ in range(300):
            t0 = time.perf_counter()
            resolve_snapshot(state, pair)
            t1 = time.perf_counter()
            resolve_snapshot(state, names)
            timings["pair"].append(t1 - t0)
            timings["all"].append(time.perf_counter() - t1)
        timings["overview"] = []
        for _ in range(20):  # what the live page asks once a second (the worker holds the state's lock meanwhile)
            t0 = time.perf_counter()
            views.overview(state, (barriers + 31) * 1000, config.liveness_ms, [])
            timings["overview"].append(time.perf_counter() - t0)
        return {"records": state.records(), "replans": len(replans) / 30, "tick": statistics.median(replans) * 1000,
                "facts": folded / len(replans), "per_fact": sum(replans) / folded * 1000,
                "announce": statistics.median(announces) * 1000, "barrier": statistics.median(per_barrier) * 1000,
                **{k: statistics.median(v) * 1000 for k, v in timings.items()}}

    print(f"{barriers:,} barriers, every table committing each, retention {retain}; then 30 barriers ticked live "
          "(medians); /snapshot medians of 300")
    rows = (("records", "state records"), ("replans", "replans per barrier"), ("facts", "facts arrived per replan"),
            ("tick", "replan (tick) (ms)"), ("per_fact", "replan time per fact arrived (ms)"),
            ("announce", "announce (ms)"), ("barrier", "leader CPU per barrier (ms)"),
            ("pair", "/snapshot of 2 tables (ms)"), ("all", "/snapshot of every table (ms)"),
            ("overview", "/overview, the page's poll (ms)"))
    for label, pacer_of in (("from scratch (baseline)", lambda: None), ("with the leader's Pacer", lambda: Pacer(config))):
        small, large = measure(shape(1, 2), pacer_of()), measure(shape(10, 9), pacer_of())
        print(f"\n{label:34}{'3 tables, 3 jobs':>18}{'100 tables, 100 jobs':>22}{'ratio':>8}")
        for key, text in rows:
            print(f"{text:34}{small[key]:18,.3f}{large[key]:22,.3f}{large[key] / small[key]:8.2f}")
    profile = cProfile.Profile()
    measure(shape(10, 9), Pacer(config), profile)
    print("\nwhere the Pacer's replans go at 100 tables (cProfile, own time, top 8):")
    pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["fold", "replay", "snapshot", "commands", "announce", "retention", "topology"])
    parser.add_argument("--events", type=int, default=1_000_000, help="events for fold/replay (default 1,000,000)")
    parser.add_argument("--requests", type=int, default=2000, help="requests for snapshot (default 2000) and commands")
    parser.add_argument("--barriers", type=int, default=604_800, help="retention: simulated barriers (a week at 1/s)")
    parser.add_argument("--tables", type=int, default=10, help="retention: tables (default 10)")
    parser.add_argument("--retain", type=int, default=100, help="retention: LOCKSTEP_RETAIN_BARRIERS (default 100)")
    args = parser.parse_args()
    {"fold": lambda: bench_fold(args.events), "replay": lambda: bench_replay(args.events),
     "snapshot": lambda: bench_snapshot(args.requests), "commands": lambda: bench_commands(args.requests),
     "announce": lambda: bench_announce(args.requests),
     "retention": lambda: bench_retention(args.barriers, args.tables, args.retain),
     "topology": lambda: bench_topology(min(args.barriers, 2000), args.retain)}[args.which]()


if __name__ == "__main__":
    main()
