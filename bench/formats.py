"""Decoding cost of the root formats, per record, against baselines measured in the same run.

The same Debezium change events (an ``orders`` row of 8 columns: decimal, date, micro-timestamp,
zoned timestamp, enum, text), once framed as Confluent Avro and once as Debezium JSON, are
decoded into the table's columns by ``spark_jobs.runtime.formats.decode``:

* ``debezium-avro-confluent``: Lockstep's path (a Python UDF: fastavro with the writer schema,
  logical types mapped per column);
* ``debezium-json``: Lockstep's JSON path (Spark's own ``from_json``, in the JVM), on the JSON
  encoding of the same events (logical types left as Debezium writes them: no mapping);
* ``debezium-json, schemas on``: the same JSON with Kafka Connect's schema in each record, into
  the typed columns (a Python UDF reads each record with its schema, maps like the Avro path);
* ``from_avro``: Spark's own Avro reader on the same bodies with the writer schema (no framing
  checks, no per-record reasons, no logical type mapping): what decoding in the JVM costs.

Each case runs ``--rounds`` times over ``--records`` records held in memory (no Kafka: this is
the decode alone), writing to Spark's ``noop`` sink; the median, the spread and the ratio to
``debezium-json`` are printed.

Usage: python -m bench.formats [--records 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import io
import json
import statistics
import struct
import time
from decimal import Decimal
from typing import Any

from bench.results import Figures, add_json_flag

DECIMAL = {"type": "bytes", "scale": 2, "precision": 10, "connect.name": "org.apache.kafka.connect.data.Decimal",
           "logicalType": "decimal"}
VALUE = {"type": "record", "name": "Value", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer_id", "type": ["null", "int"], "default": None},
    {"name": "amount", "type": ["null", DECIMAL], "default": None},
    {"name": "placed", "type": ["null", {"type": "int", "connect.name": "io.debezium.time.Date"}], "default": None},
    {"name": "seen", "type": ["null", {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}], "default": None},
    {"name": "seen_tz", "type": ["null", {"type": "string", "connect.name": "io.debezium.time.ZonedTimestamp"}],
     "default": None},
    {"name": "status", "type": ["null", {"type": "string", "connect.name": "io.debezium.data.Enum"}], "default": None},
    {"name": "note", "type": ["null", "string"], "default": None}]}
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "bench.public.orders", "fields": [
    {"name": "before", "type": ["null", VALUE], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": ["null", "long"], "default": None}]}
AVRO_COLUMNS = (("id", "BIGINT"), ("customer_id", "INT"), ("amount", "DECIMAL(10, 2)"), ("placed", "DATE"),
                ("seen", "TIMESTAMP_NTZ"), ("seen_tz", "TIMESTAMP"), ("status", "STRING"), ("note", "STRING"))
AVRO_DDL = ", ".join(f"{name} {kind}" for name, kind in AVRO_COLUMNS)
JSON_DDL = ("id BIGINT, customer_id INT, amount STRING, placed INT, seen BIGINT, seen_tz STRING, status STRING, "
            "note STRING")  # the JSON path maps no logical types: Debezium's own encodings
SCHEMA_ID = 7
CONNECT_ROW = [  # the same row as Kafka Connect's JsonConverter describes it (schemas on)
    {"field": "id", "type": "int64"}, {"field": "customer_id", "type": "int32", "optional": True},
    {"field": "amount", "type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "2"}},
    {"field": "placed", "type": "int32", "optional": True, "name": "io.debezium.time.Date"},
    {"field": "seen", "type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp"},
    {"field": "seen_tz", "type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp"},
    {"field": "status", "type": "string", "optional": True, "name": "io.debezium.data.Enum"},
    {"field": "note", "type": "string", "optional": True}]
CONNECT_SCHEMA = {"type": "struct", "name": "bench.public.orders.Envelope", "fields": [
    {"field": "before", "type": "struct", "optional": True, "fields": CONNECT_ROW},
    {"field": "after", "type": "struct", "optional": True, "fields": CONNECT_ROW},
    {"field": "op", "type": "string"}, {"field": "ts_ms", "type": "int64", "optional": True}]}


def events(count: int) -> list[tuple[bytes, bytes, bytes, bytes]]:
    """(key, Confluent-framed Avro value, Debezium JSON value, the same with its schema) of
    ``count`` change events."""
    import fastavro

    parsed = fastavro.parse_schema(ENVELOPE)
    out = []
    for i in range(count):
        row = {"id": i, "customer_id": i % 1000, "amount": Decimal(i % 100_000) / 100, "placed": 19000 + i % 800,
               "seen": 1_704_164_645_123_456 + i, "seen_tz": "2024-01-02T01:04:05.123456Z",
               "status": ("placed", "paid", "shipped")[i % 3], "note": f"order {i}"}
        body = io.BytesIO()
        body.write(b"\x00" + struct.pack(">I", SCHEMA_ID))
        fastavro.schemaless_writer(body, parsed, {"before": None, "after": row, "op": "c" if i % 4 else "u", "ts_ms": i})
        unscaled = int(row["amount"] * 100)
        after = {**row, "amount": base64.b64encode(unscaled.to_bytes(4, "big", signed=True)).decode()}
        payload = {"before": None, "after": after, "op": "c" if i % 4 else "u", "ts_ms": i}
        out.append((json.dumps({"id": i}).encode(), body.getvalue(), json.dumps(payload).encode(),
                    json.dumps({"schema": CONNECT_SCHEMA, "payload": payload}).encode()))
    return out


def timed(frame: Any) -> float:
    began = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    add_json_flag(parser)
    args = parser.parse_args()
    figures = Figures("formats", args)

    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    from coordinator.settings import Settings
    from spark_jobs.planning.pipeline import parse_pipeline
    from spark_jobs.runtime.formats import decode
    from spark_jobs.runtime.session import build_session

    spark = build_session("bench-formats", settings=Settings.from_env())
    made = time.perf_counter()
    rows = events(args.records)
    print(f"{args.records:,} events made in {time.perf_counter() - made:.1f} s (Python, not timed below)")
    schema = "key BINARY, value BINARY, topic STRING, `partition` INT, `offset` BIGINT, `timestamp` TIMESTAMP"
    now = dt.datetime(2024, 1, 1)
    avro = spark.createDataFrame([(r[0], r[1], "t", 0, i, now) for i, r in enumerate(rows)], schema).cache()
    text = spark.createDataFrame([(r[0], r[2], "t", 0, i, now) for i, r in enumerate(rows)], schema).cache()
    typed = spark.createDataFrame([(r[0], r[3], "t", 0, i, now) for i, r in enumerate(rows)], schema).cache()
    avro.count(), text.count(), typed.count()

    def table(fmt: str, ddl: str) -> Any:
        sql = f"CREATE TABLE orders ({ddl}) WITH ('source' = 'kafka:t', 'format' = '{fmt}', 'primary_key' = 'id')"
        return parse_pipeline(sql).roots[0]

    avro_table, json_table = table("debezium-avro-confluent", AVRO_DDL), table("debezium-json", JSON_DDL)
    typed_table = table("debezium-json", AVRO_DDL)
    cases = {
        "debezium-json": lambda: decode(text, json_table).where(~F.col("is_bad")).select("row.*", "is_delete"),
        "debezium-json, schemas on": lambda: decode(typed, typed_table).where(~F.col("is_bad")).select("row.*", "is_delete"),
        "debezium-avro-confluent": lambda: decode(avro, avro_table, {SCHEMA_ID: json.dumps(ENVELOPE)}, "")
        .where(~F.col("is_bad")).select("row.*", "is_delete"),
        "from_avro (JVM)": lambda: avro.select(from_avro(F.expr("substring(value, 6)"), json.dumps(ENVELOPE))
                                               .alias("e")).select("e.after.*", "e.op"),
    }
    bad = decode(avro, avro_table, {SCHEMA_ID: json.dumps(ENVELOPE)}, "").where("is_bad").count()
    bad += decode(typed, typed_table).where("is_bad").count()
    assert bad == 0, f"{bad} records rejected"
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):  # alternate, so a noisy moment hits every case
        for name, frame in cases.items():
            times[name].append(timed(frame()))
    where = python_costs(rows[: min(len(rows), 50_000)])
    base = statistics.median(times["debezium-json"])
    print(f"{'format':<26}{'median s':>10}{'min-max s':>16}{'records/s':>14}{'vs json':>9}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<26}{median:>10.2f}{f'{min(values):.2f}-{max(values):.2f}':>16}"
              f"{args.records / median:>14,.0f}{median / base:>8.1f}x")
        figures.add("decode s", median, "s", baseline=base, ratio=median / base, samples=values, format=name,
                    records=args.records)
        figures.add("decode records/s", args.records / median, "records/s", baseline=args.records / base,
                    ratio=median / base, format=name, records=args.records)
    avro_median = statistics.median(times["debezium-avro-confluent"])
    cores = spark.sparkContext.defaultParallelism
    print(f"where the time of debezium-avro-confluent goes (per record, one core; Spark used {cores}):")
    print(f"  fastavro decode {where['fastavro'] * 1e6:.1f} µs, column mapping {where['mapping'] * 1e6:.1f} µs "
          f"(read_record {where['read_record'] * 1e6:.1f} µs in a plain Python loop); in Spark "
          f"{avro_median / args.records * cores * 1e6:.1f} µs per record per core, "
          "the rest is moving rows between the JVM and Python")
    for name, seconds in (("fastavro decode", where["fastavro"]), ("column mapping", where["mapping"]),
                          ("read_record", where["read_record"])):
        figures.add(f"{name} µs per record", seconds * 1e6, "µs", format="debezium-avro-confluent", loop="plain Python",
                    records=min(len(rows), 50_000))
    figures.add("in Spark µs per record per core", avro_median / args.records * cores * 1e6, "µs",
                format="debezium-avro-confluent", cores=cores, records=args.records)
    spark.stop()
    figures.write()


def python_costs(rows: list[tuple[bytes, bytes, bytes, bytes]]) -> dict[str, float]:
    """Seconds per record of the UDF's work without Spark: fastavro alone, then all of read_record."""
    import fastavro

    from spark_jobs.runtime.confluent import Target, read_record

    parsed = fastavro.parse_schema(ENVELOPE)
    began = time.perf_counter()
    for _, value, _, _ in rows:
        fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed, None)
    decode_only = (time.perf_counter() - began) / len(rows)
    target = Target(AVRO_COLUMNS, ("id",), True)
    known = {SCHEMA_ID: json.dumps(ENVELOPE)}
    began = time.perf_counter()
    for key, value, _, _ in rows:
        read_record(key, value, target, known, "")
    whole = (time.perf_counter() - began) / len(rows)
    return {"fastavro": decode_only, "read_record": whole, "mapping": whole - decode_only}


if __name__ == "__main__":
    main()
