"""The change-data-capture stack of a test session: PostgreSQL, the schema registry and Kafka
Connect with Debezium, started once (about 20 s) on free ports next to the session's broker."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from coordinator.settings import Settings
from lockstep.dev.connect import LocalConnect, postgres_source
from lockstep.dev.postgres import LocalPostgres
from lockstep.dev.registry import LocalRegistry
from tests.support import up_on_a_free_port, wait_until


def end_offset(bootstrap: str, topic: str) -> int:
    """The end offset of a connector's (one-partition) topic; 0 while the connector has not created it."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    except KafkaException:
        return 0
    finally:
        consumer.close()


def settled(bootstrap: str, topics: list[str], quiet_s: float = 3.0, timeout: float = 120.0) -> dict[str, int]:
    """Each topic's end offset once none has grown for ``quiet_s`` seconds (the connector wrote
    every change the source made)."""
    last: dict[str, int] = {}
    since = time.monotonic()
    deadline = since + timeout
    while time.monotonic() < deadline:
        now = {topic: end_offset(bootstrap, topic) for topic in topics}
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s and all(now.values()):
            return now
        time.sleep(0.5)
    raise AssertionError(f"the topics did not settle within {timeout:.0f} s: {last}")


@dataclass
class CdcStack:
    postgres: LocalPostgres
    registry: LocalRegistry
    connect: LocalConnect

    def capture(self, tables: list[str], **config: str) -> str:
        """Start a Debezium connector for ``tables`` (``public.name``) with a fresh topic prefix,
        return that prefix once its task runs; its topics are ``<prefix>.public.<name>``."""
        prefix = f"cdc_{uuid.uuid4().hex[:8]}"
        self.connect.add(postgres_source(prefix, self.postgres, prefix, tables, **config))
        wait_until(lambda: [t["state"] for t in self.connect.status(prefix)["tasks"]] == ["RUNNING"],
                   f"connector {prefix} running", timeout=60)
        return prefix


@pytest.fixture(scope="session")
def cdc_stack(kafka_bootstrap: str, base_settings: Settings) -> Iterator[CdcStack]:
    """One PostgreSQL (database ``shop``), registry and Connect worker for the session. Their home
    is a folder the ``postgres`` user can reach (pytest's own temporary folders are private)."""
    home = Path(tempfile.mkdtemp(prefix="lockstep-cdc-"))
    home.chmod(0o755)
    started: list[LocalPostgres | LocalRegistry | LocalConnect] = []
    try:
        postgres = up_on_a_free_port(lambda port: LocalPostgres(home / "postgres", port, "shop"))
        started.append(postgres)
        registry = up_on_a_free_port(lambda port: LocalRegistry(home / "registry", base_settings.jars / "registry", port))
        started.append(registry)
        connect = up_on_a_free_port(
            lambda port: LocalConnect(home / "connect", base_settings.jars / "connect", port, kafka_bootstrap, registry))
        started.append(connect)
        yield CdcStack(postgres, registry, connect)
    finally:
        for server in reversed(started):
            if isinstance(server, LocalPostgres):
                server.destroy()
            else:
                server.down()
        shutil.rmtree(home, ignore_errors=True)
