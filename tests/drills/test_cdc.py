"""A CDC pipeline end to end: Debezium and Avro root tables, every incremental operator downstream.

Random inserts, updates and deletes (with tombstones and some bad records) go to Kafka in
rounds while the jobs run. At randomly picked common exact points, every table must equal the
same query computed in plain Python over the records up to that barrier's cut, and every
rejected record must be in a dead-letter table with its reason.
"""

from __future__ import annotations

import io
import json
import random
import time
from collections.abc import Callable
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from tests.support.barriers import at, read_state, wait_for_barrier
from tests.support.oracles import ORDERS, QUERIES, USERS, Row, derived_sql, normalise

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLICK_SCHEMA = {"type": "record", "name": "Click", "fields": [
    {"name": "user_id", "type": "long"}, {"name": "url", "type": "string"}, {"name": "ms", "type": ["null", "double"]}]}

Effect = tuple[str, Any]  # ("upsert", row) | ("delete", key) | ("bad", expected reason start)


class CdcSource:
    """Writes Debezium change events for one table and remembers what each record means."""

    def __init__(self, producer: Producer, topic: str, columns: list[str], rng: random.Random) -> None:
        self.producer, self.topic, self.columns, self.rng = producer, topic, columns, rng
        self.rows: dict[int, Row] = {}
        self.effects: dict[tuple[int, int], Effect] = {}  # (partition, offset) -> effect

    def _send(self, key: int | None, value: bytes | None, effect: Effect) -> None:
        def done(err: Any, msg: Any) -> None:
            assert err is None, err
            self.effects[(msg.partition(), msg.offset())] = effect

        record_key = None if key is None else json.dumps({self.columns[0]: key}).encode()
        self.producer.produce(self.topic, key=record_key, value=value, on_delivery=done)

    def image(self, row: Row | None) -> dict[str, Any] | None:
        return None if row is None else dict(zip(self.columns, row, strict=True))

    def change(self, key: int, row: Row | None) -> None:
        before = self.rows.get(key)
        op = "d" if row is None else ("u" if before else self.rng.choice("cr"))
        if op == "d" and before is None:
            return
        event: dict[str, Any] = {"before": self.image(before), "after": self.image(row), "op": op, "ts_ms": 1}
        if self.rng.random() < 0.3:
            event = {"schema": {}, "payload": event}  # the envelope Debezium writes with schemas on
        self._send(key, json.dumps(event).encode(), ("delete", key) if row is None else ("upsert", row))
        if row is None:
            del self.rows[key]
            self._send(key, None, ("delete", key))  # Debezium's tombstone after a delete
        else:
            self.rows[key] = row

    def bad(self, value: bytes, reason: str) -> None:
        self._send(None, value, ("bad", reason))

    def table_at(self, cut: dict[int, int]) -> dict[int, Row]:
        """The table as of a barrier's cut: records in offset order per partition."""
        rows: dict[int, Row] = {}
        for (partition, offset), (kind, what) in sorted(self.effects.items()):
            if offset >= cut.get(partition, 0):
                continue
            if kind == "upsert":
                rows[what[0]] = what
            elif kind == "delete":
                rows.pop(what, None)
        return rows


def avro(record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, CLICK_SCHEMA, record)
    return out.getvalue()


def test_cdc_pipeline_matches_python_at_random_barriers(
    spark: SparkSession, run_pipeline: Callable[[str], Settings], make_topic: Callable, kafka_bootstrap: str
) -> None:
    rng = random.Random(11)
    topics = {"orders": make_topic(partitions=2), "users": make_topic(partitions=1), "clicks": make_topic(partitions=1)}
    settings = run_pipeline(
        f"CREATE TABLE orders ({ORDERS}) WITH ('source' = 'kafka:{topics['orders']}', 'format' = 'debezium-json', "
        "'primary_key' = 'oid');\n"
        f"CREATE TABLE users ({USERS}) WITH ('source' = 'kafka:{topics['users']}', 'format' = 'debezium-json', "
        "'primary_key' = 'id');\n"
        f"CREATE TABLE clicks (user_id BIGINT, url STRING, ms DOUBLE) WITH ('source' = 'kafka:{topics['clicks']}', "
        f"'format' = 'avro', 'avro_schema' = '{json.dumps(CLICK_SCHEMA)}');\n" + derived_sql()
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    orders = CdcSource(producer, topics["orders"], ["oid", "uid", "amount", "price", "note"], rng)
    users = CdcSource(producer, topics["users"], ["id", "name", "region"], rng)
    clicks: list[tuple[int, bytes, str | None]] = []  # (offset, value, expected DLQ reason or None)
    for round_number in range(4):
        for _ in range(40):
            key = rng.randrange(25)
            if key in orders.rows and rng.random() < 0.3:
                orders.change(key, None)
            else:
                orders.change(key, (key, rng.choice([1, 2, 3, 4, None]), rng.randrange(10),
                                    rng.choice([1.5, 2.0, None]), rng.choice(["a", "b", None])))
        for _ in range(3):
            key = rng.randrange(5)
            users.change(key, None if key in users.rows and rng.random() < 0.2 else (
                key, f"user{key}", rng.choice(["north", "south", None])))
        for i in range(5):
            value = avro({"user_id": i, "url": f"/p{round_number}", "ms": None if i % 2 else 1.0 * i})
            clicks.append((len(clicks), value, None))
        clicks.append((len(clicks), b"\x07garbage", "cannot decode as Avro"))
        producer.flush(10)
        time.sleep(rng.uniform(0.2, 1.0))
    orders.bad(b"{not json", "malformed JSON")
    orders.bad(json.dumps({"op": "t", "before": None, "after": None}).encode(), "unknown Debezium op 't'")
    orders.bad(json.dumps({"op": "c", "after": {"oid": 1, "amount": "lots"}}).encode(), "column after.amount: expected BIGINT")
    orders.bad(json.dumps({"op": "u", "before": {"oid": 1}, "after": None}).encode(), "Debezium op 'u' (update) needs a 'after'")
    for _, value, _ in clicks:
        producer.produce(topics["clicks"], value=value)
    producer.flush(10)

    tables = ["orders", "users", "clicks", *QUERIES]
    ends = {t: {} for t in topics}
    for source, t in ((orders, "orders"), (users, "users")):
        for (p, off) in source.effects:
            ends[t][p] = max(ends[t].get(p, 0), off + 1)
    state, last = wait_for_barrier(settings, tables, ends["orders"], topics["orders"], timeout=240)
    state, last = wait_for_barrier(settings, tables, ends["users"], topics["users"], timeout=60)
    state, last = wait_for_barrier(settings, tables, {0: len(clicks)}, topics["clicks"], timeout=60)
    common = sorted(set.intersection(*(set(state.exact_points(t)) for t in tables)))
    picked = sorted({*rng.sample(common, min(3, len(common))), last})

    for b in picked:
        cuts = {t: {} for t in topics}
        for c in state.barriers[b].cut:
            for name, topic in topics.items():
                if c.topic == topic:
                    cuts[name][c.partition] = c.offset
        o, u = orders.table_at(cuts["orders"]), users.table_at(cuts["users"])
        assert normalise([tuple(r) for r in at(spark, settings, "orders", state.exact_points("orders")[b]).collect()]) == \
            normalise(list(o.values())), b
        for name, (_, oracle) in QUERIES.items():
            got = at(spark, settings, name, state.exact_points(name)[b])
            visible = [c for c in got.columns if not c.startswith("__lockstep_")]
            assert normalise([tuple(r) for r in got.select(*visible).collect()]) == normalise(oracle(o, u)), (name, b)

    state = read_state(settings)
    clicks_rows = at(spark, settings, "clicks", state.exact_points("clicks")[state.latest_exact("clicks")]).collect()
    assert len(clicks_rows) == sum(1 for *_, why in clicks if why is None)
    for table, source_effects in (("orders", orders.effects), ("clicks", {(0, off): ("bad", why) if why else ("ok", None)
                                                                          for off, _, why in clicks})):
        dlq = {(r["partition"], r["offset"]): r["error"]
               for r in spark.read.format("delta").load(settings.table_location(f"{table}__dlq")).collect()}
        expected_bad = {k: why for k, (kind, why) in source_effects.items() if kind == "bad"}
        assert set(dlq) == set(expected_bad), table
        for k, why in expected_bad.items():
            assert dlq[k].startswith(why) or why in dlq[k], (table, dlq[k], why)
        completions = state.completions[table].values()
        assert sum(c.rows_in for c in completions) == len(source_effects)
        assert sum(c.rows_out + c.rows_rejected for c in completions) == len(source_effects)
