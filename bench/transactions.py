"""What whole source transactions cost a root job, against the same job without them, in one run.

A Debezium-shaped JSON topic (``bench.public.orders``: transactions of 1-4 change events over
``--keys`` keys) and its transaction topic (BEGIN and END markers) are written to a local broker;
then the same barriers (``--barriers`` of ``--per-barrier`` transactions each) are ingested by
``RootIngestion`` twice per round, into fresh tables: with ``'transactions'`` and without. The
transaction topic is cut in the middle of each barrier's transactions and the table after them,
so the aligned job ends each barrier earlier than its cut (``--read-on``: the table is cut inside
a transaction whose END is in, so every barrier reads on past its cut, the costly case).
Printed: median per-barrier time and spread of each, the ratio, and where the time goes (the
phases the completions carried).

Usage: python -m bench.transactions [--barriers 20] [--per-barrier 2000] [--rounds 3] [--read-on]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import Counter
from typing import Any

from bench.results import Figures, add_json_flag
from bench.stack import local_stack

DDL = "id BIGINT, v BIGINT, name STRING"


def write_source(bootstrap: str, topic: str, tx_topic: str, barriers: int, per_barrier: int, keys: int,
                 read_on: bool) -> list[tuple[int, int]]:
    """Write the transactions; return each barrier's cut (table offset, transaction-topic offset):
    the table's after the barrier's last event and the markers' in the middle (the job stops
    early), or with ``read_on`` the other way round (the job reads on past its cut)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from coordinator.client.topics import create_topics

    create_topics(AdminClient({"bootstrap.servers": bootstrap}), [NewTopic(topic, 1, 1), NewTopic(tx_topic, 1, 1)])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000})
    rng, data_offset, tx_offset, cuts = random.Random(7), 0, 0, []
    collection = ".".join(topic.split(".")[-2:])

    def send(target: str, value: dict[str, Any]) -> None:
        while True:
            try:
                producer.produce(target, value=json.dumps(value).encode(), partition=0)
                return
            except BufferError:
                producer.poll(0.5)

    for b in range(barriers):
        for t in range(per_barrier):
            tx = b * per_barrier + t + 1
            send(tx_topic, {"status": "BEGIN", "id": f"{tx}:1", "event_count": None, "data_collections": None})
            events = rng.randint(1, 4)
            for _ in range(events):
                key = rng.randrange(keys)
                send(topic, {"before": None, "after": {"id": key, "v": tx, "name": f"n{tx % 97}"}, "op": "u",
                             "transaction": {"id": f"{tx}:2", "total_order": 1, "data_collection_order": 1}})
            send(tx_topic, {"status": "END", "id": f"{tx}:3", "event_count": events,
                            "data_collections": [{"data_collection": collection, "event_count": events}]})
            data_offset, tx_offset = data_offset + events, tx_offset + 2
            if t == per_barrier // 2:
                data_middle, tx_middle = data_offset - 1, tx_offset  # inside, and after, the middle transaction
        cuts.append((data_middle, tx_offset) if read_on else (data_offset, tx_middle))
        producer.poll(0)
    producer.flush(120)
    return cuts


def main() -> None:  # noqa: PLR0915 - one run, printed as it goes
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--barriers", type=int, default=20)
    parser.add_argument("--per-barrier", type=int, default=2000, help="transactions per barrier")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--read-on", action="store_true",
                        help="cut the table inside a transaction whose END is in: every barrier reads past its cut")
    add_json_flag(parser)
    args = parser.parse_args()
    figures = Figures("transactions", args)

    from coordinator.domain.events import OffsetRange
    from coordinator.domain.work import EARLIEST, BarrierWork
    from spark_jobs.planning.pipeline import parse_pipeline
    from spark_jobs.runtime.commits import CompletionPublisher
    from spark_jobs.runtime.ingest import RootIngestion

    class RecordingPublisher(CompletionPublisher):
        """Publishes as the jobs do, and keeps each completion for the phases it carries."""

        def __init__(self, settings: Any) -> None:
            super().__init__(settings)
            self.facts: list[Any] = []

        def publish(self, *args: Any, **kwargs: Any) -> Any:
            fact = super().publish(*args, **kwargs)
            self.facts.append(fact)
            return fact

    from spark_jobs.runtime.kafka_ranges import kafka_source_options
    from spark_jobs.runtime.session import build_session

    topic, tx_topic = "bench.public.orders", "bench.transaction"
    with local_stack() as settings:
        cuts = write_source(settings.bootstrap, topic, tx_topic, args.barriers, args.per_barrier, args.keys, args.read_on)
        print(f"{args.barriers} barriers of {args.per_barrier:,} transactions: {cuts[-1][0]:,} change events, "
              f"{cuts[-1][1]:,} markers")
        spark = build_session("bench-transactions", settings=settings)
        times: dict[str, list[float]] = {"without": [], "with 'transactions'": []}
        phases: dict[str, Counter[str]] = {name: Counter() for name in times}
        for round_number in range(args.rounds):
            for name in times:
                option = f", 'transactions' = 'kafka:{tx_topic}'" if name != "without" else ""
                name_sql = f"t{round_number}_{'aligned' if option else 'plain'}"  # a table of its own per case
                sql = (f"CREATE TABLE {name_sql} ({DDL}) WITH ('source' = 'kafka:{topic}', "
                       f"'format' = 'debezium-json', 'primary_key' = 'id'{option})")
                table = parse_pipeline(sql).roots[0]
                publisher = RecordingPublisher(settings)
                job = RootIngestion(spark.newSession(), table, f"ingest_{table.name}", settings.table_location,
                                    publisher, kafka_source_options(settings))
                before = (EARLIEST, EARLIEST)
                began = time.perf_counter()
                for b, (data_cut, tx_cut) in enumerate(cuts, start=1):
                    offsets = [OffsetRange(topic, 0, before[0], data_cut)]
                    if table.transactions:
                        offsets.append(OffsetRange(tx_topic, 0, before[1], tx_cut))
                    job.process(BarrierWork(b, 0, 0, offsets=offsets))
                    before = (data_cut, tx_cut)
                times[name].append((time.perf_counter() - began) / len(cuts))
                for fact in publisher.facts:
                    phases[name].update({p.name: p.ms / 1000 for p in fact.phases})
                job.close()
        base = statistics.median(times["without"])
        print(f"{'root job':<22}{'median s/barrier':>18}{'min-max':>14}{'vs without':>12}")
        for name, values in times.items():
            median = statistics.median(values)
            print(f"{name:<22}{median:>18.3f}{f'{min(values):.2f}-{max(values):.2f}':>14}{median / base:>11.2f}x")
            figures.add("root job s/barrier", median, "s", baseline=base, ratio=median / base, samples=values, case=name,
                        read_on=args.read_on)
        print("where the time goes (phases the completions carried, s per barrier, all rounds):")
        for name, spent in phases.items():
            print(f"  {name}: " + ", ".join(f"{k} {v / len(cuts) / args.rounds:.3f}" for k, v in sorted(spent.items())))
            for k, v in sorted(spent.items()):
                figures.add(f"phase {k} s/barrier", v / len(cuts) / args.rounds, "s", case=name, read_on=args.read_on)
        spark.stop()
    figures.write()


if __name__ == "__main__":
    main()
