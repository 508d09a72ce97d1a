"""``lockstep dev up --postgres --connect``: the change-data-capture stack of the local machine
(PostgreSQL, Apicurio Registry, Kafka Connect with Debezium), each in its own home and port,
and a database change that reaches Kafka as Avro framed with a schema id the registry serves."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import time
import urllib.request
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Consumer

from coordinator.settings import Settings
from lockstep.dev.connect import LocalConnect, postgres_source
from lockstep.dev.postgres import LocalPostgres
from lockstep.dev.registry import LocalRegistry
from lockstep.dev.service import HOST, free_port, process_alive
from tests.support import ROOT, run_lockstep

pytestmark = [pytest.mark.integration]


def lockstep(home: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_lockstep(*args, env={**os.environ, "LOCKSTEP_HOME": str(home), "LOCKSTEP_JARS": str(ROOT / ".lockstep/jars"),
                                    **env}, timeout=240)


def framed(value: bytes, registry_url: str) -> tuple[int, dict[str, Any]]:
    """The schema id of a Confluent-framed Avro record and the record, decoded with the schema
    the registry serves for that id."""
    assert value[0] == 0, f"not Confluent framing: {value[:8]!r}"
    schema_id = struct.unpack(">I", value[1:5])[0]
    with urllib.request.urlopen(f"{registry_url}/schemas/ids/{schema_id}", timeout=10) as response:
        schema = fastavro.parse_schema(json.loads(json.loads(response.read())["schema"]))
    return schema_id, fastavro.schemaless_reader(io.BytesIO(value[5:]), schema, None)


class Topics:
    """Reads the records of some topics from their start, in the order each topic has them."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{time.time_ns()}",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
        self.consumer.subscribe(topics)
        self.topics = topics

    def take(self, count: int, timeout: float = 60.0) -> list[bytes]:
        """The next ``count`` values that are not tombstones."""
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            message = self.consumer.poll(0.5)
            if message is not None and not message.error() and message.value() is not None:
                got.append(message.value())
        assert len(got) == count, f"{len(got)} of {count} records on {self.topics} within {timeout:.0f}s"
        return got

    def close(self) -> None:
        self.consumer.close()


def test_dev_up_runs_the_cdc_stack_and_a_database_change_arrives_as_registry_framed_avro(tmp_path: Path) -> None:
    env = {"LOCKSTEP_BOOTSTRAP": f"{HOST}:{free_port()}",
           "LOCKSTEP_POSTGRES_URL": f"postgresql://postgres@{HOST}:{free_port()}/shop",
           "LOCKSTEP_SCHEMA_REGISTRY_URL": f"http://{HOST}:{free_port()}/apis/ccompat/v7",
           "LOCKSTEP_CONNECT_URL": f"http://{HOST}:{free_port()}"}
    settings = Settings.from_env({"LOCKSTEP_HOME": str(tmp_path), **env})
    started = time.monotonic()
    up = lockstep(tmp_path, env, "dev", "up", "--postgres", "--connect")
    took = time.monotonic() - started
    pg, registry = LocalPostgres.for_settings(settings), LocalRegistry.for_settings(settings)
    assert pg is not None and registry is not None
    connect = LocalConnect.for_settings(settings, registry)
    assert connect is not None
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        for line in (f"LOCKSTEP_POSTGRES_URL={pg.url}", f"LOCKSTEP_SCHEMA_REGISTRY_URL={registry.url}",
                     f"LOCKSTEP_CONNECT_URL={connect.url}"):
            assert line in up.stdout
        assert took < 90, f"the stack took {took:.0f}s to start"
        status = json.loads(lockstep(tmp_path, env, "dev", "status", "--format", "json").stdout)
        assert status["postgres"]["url"] == pg.url and status["registry"]["url"] == registry.url
        assert status["connect"]["url"] == connect.url
        pids = [status[name]["pid"] for name in ("postgres", "registry", "connect")]

        # rows that exist before the connector starts arrive as its snapshot, then the changes
        pg.sql("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2), placed date);"
               "INSERT INTO orders VALUES (1, 2.50, '2024-02-29'), (2, 3.75, NULL);")
        connect.add(postgres_source("shop", pg, topic_prefix="shop", tables=["public.orders"]))
        assert connect.status("shop")["connector"]["state"] in ("RUNNING", "UNASSIGNED")
        orders, transactions = (Topics(settings.bootstrap, [topic]) for topic in ("shop.public.orders", "shop.transaction"))
        records = [framed(value, registry.url) for value in orders.take(2)]  # the snapshot is read, changes are next
        pg.sql("BEGIN; UPDATE orders SET amount = 9.99 WHERE id = 2; DELETE FROM orders WHERE id = 1; COMMIT;")
        records += [framed(value, registry.url) for value in orders.take(2)]
        changes = [(r["op"], (r["before"] or {}).get("id"), r["after"] and (r["after"]["id"], r["after"]["amount"]))
                   for _, r in records]
        assert changes == [("r", None, (1, Decimal("2.50"))), ("r", None, (2, Decimal("3.75"))),
                           ("u", None, (2, Decimal("9.99"))), ("d", 1, None)]
        assert records[0][1]["after"]["placed"] == 19782  # io.debezium.time.Date: days since 1970-01-01
        assert records[2][1]["transaction"]["id"].startswith(f"{records[2][1]['source']['txId']}:")
        assert records[2][1]["source"]["txId"] == records[3][1]["source"]["txId"]  # one source transaction
        # the transaction's BEGIN and END, END counting its two events
        markers = [framed(value, registry.url)[1] for value in transactions.take(2)]
        assert [(m["status"], m["event_count"]) for m in markers] == [("BEGIN", None), ("END", 2)]

        # a new column is a new schema (id); records before it keep theirs
        pg.sql("ALTER TABLE orders ADD COLUMN note text; INSERT INTO orders VALUES (3, 1.00, NULL, 'new');")
        latest = framed(orders.take(1)[0], registry.url)
        assert latest[1]["after"]["note"] == "new" and latest[0] != records[0][0]
        orders.close()
        transactions.close()
    finally:
        down = lockstep(tmp_path, env, "dev", "down")
        pg.destroy()  # its data folder too (under the postgres user's home: pytest's folders are private)
    assert down.returncode == 0, down.stdout + down.stderr
    for name in ("connect stopped", "registry stopped", "postgres stopped", "broker stopped"):
        assert name in down.stdout
    assert not any(process_alive(pid) for pid in pids)


def test_the_managed_cdc_servers_follow_the_settings(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, jars=tmp_path / "jars")
    pg, registry = LocalPostgres.for_settings(settings), LocalRegistry.for_settings(settings)
    assert pg is not None and (pg.port, pg.database, pg.url) == (5432, "lockstep", f"postgresql://postgres@{HOST}:5432/lockstep")
    assert registry is not None and registry.url == f"http://{HOST}:8081/apis/ccompat/v7"
    connect = LocalConnect.for_settings(settings, registry)
    assert connect is not None and connect.url == f"http://{HOST}:8083"
    elsewhere = Settings(postgres_url="postgresql://app@db.example.com:5432/shop",
                         schema_registry_url="http://registry.example.com:8081", connect_url="http://connect.example.com")
    assert LocalPostgres.for_settings(elsewhere) is None and LocalRegistry.for_settings(elsewhere) is None
    assert LocalConnect.for_settings(elsewhere, registry) is None


def test_a_registry_elsewhere_is_not_ours_to_start_and_nothing_starts(tmp_path: Path) -> None:
    env = {"LOCKSTEP_BOOTSTRAP": f"{HOST}:{free_port()}", "LOCKSTEP_SCHEMA_REGISTRY_URL": "http://registry.example.com:8081"}
    done = lockstep(tmp_path, env, "dev", "up", "--connect")
    assert done.returncode == 2 and "LOCKSTEP_SCHEMA_REGISTRY_URL=http://registry.example.com:8081" in done.stderr
    assert "broker" not in done.stdout  # nothing started
