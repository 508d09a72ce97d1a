"""Kafka Connect of the local change-data-capture stack: one standalone worker on 127.0.0.1 with the
Debezium PostgreSQL connector and Apicurio's Avro converter, from the jars ``scripts/setup``
cached. Connectors are added the way users add them everywhere, through Connect's REST API
(``POST /connectors``); a standalone worker keeps them in memory and its source offsets in
``home/offsets``. Records are Avro framed the Confluent way (a zero byte, the 4-byte schema id
of the local registry, the body), which the ``avro-confluent`` formats read.

Example::

    connect = LocalConnect(home=Path(".lockstep/connect"), jars=Path(".lockstep/jars/connect"), port=8083,
                           bootstrap="127.0.0.1:9092", registry=registry)
    connect.up()
    connect.add(postgres_source("shop", pg, topic_prefix="shop", tables=["public.orders"]))
    connect.status("shop")["tasks"][0]["state"]     # 'RUNNING'
    connect.down()
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from coordinator.settings import Settings
from lockstep.dev.postgres import SUPERUSER, LocalPostgres
from lockstep.dev.registry import LocalRegistry
from lockstep.dev.service import HOST, LocalService, ServiceError

MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"
DEFAULT_PORT = 8083
AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"


class ConnectError(ServiceError):
    """The local Kafka Connect worker could not be started or asked; the message says why."""


def converter(registry: LocalRegistry) -> dict[str, str]:
    """Key and value converters that write Avro framed the Confluent way (magic byte, 4-byte id
    that the registry's Confluent-compatible API resolves), registering schemas as they change."""
    options = {
        "apicurio.registry.url": registry.native_url,
        "apicurio.registry.auto-register": "true",
        "apicurio.registry.find-latest": "true",
        "apicurio.registry.as-confluent": "true",  # 4-byte ids, as Confluent's serializers write them
        "apicurio.registry.use-id": "contentId",  # the ids /apis/ccompat/v7/schemas/ids/{id} serves
        "apicurio.registry.headers.enabled": "false",  # the id in the record, not in headers
    }
    return {f"{side}.converter": AVRO_CONVERTER for side in ("key", "value")} | {
        f"{side}.converter.{key}": value for side in ("key", "value") for key, value in options.items()}


def postgres_source(name: str, postgres: LocalPostgres, topic_prefix: str, tables: Sequence[str],
                    **overrides: str) -> dict[str, Any]:
    """The ``POST /connectors`` body of a Debezium PostgreSQL connector: a snapshot of ``tables``
    (``schema.table``), then their changes, into topics ``<topic_prefix>.<schema>.<table>``, with
    transaction metadata (``<topic_prefix>.transaction``) and topics created as they are needed."""
    config = {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": HOST,
        "database.port": str(postgres.port),
        "database.user": SUPERUSER,
        "database.dbname": postgres.database,
        "topic.prefix": topic_prefix,
        "table.include.list": ",".join(tables),
        "plugin.name": "pgoutput",  # built into PostgreSQL 10+; Debezium's default (decoderbufs) is not
        "slot.name": f"{topic_prefix.replace('.', '_').replace('-', '_')}_slot",
        "publication.name": f"{topic_prefix.replace('.', '_').replace('-', '_')}_publication",
        "publication.autocreate.mode": "filtered",
        "provide.transaction.metadata": "true",
        "schema.name.adjustment.mode": "avro",
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
        **overrides,
    }
    return {"name": name, "config": config}


class LocalConnect(LocalService):
    """Owns one standalone Connect worker: its properties, offsets, log and pid file under ``home``."""

    name = "connect"
    main_class = MAIN_CLASS
    error = ConnectError
    port_setting = f"LOCKSTEP_CONNECT_URL=http://{HOST}:<port>"

    def __init__(self, home: Path, jars: Path, port: int, bootstrap: str, registry: LocalRegistry,
                 kafka: Mapping[str, str] | None = None, heap: str = "512m") -> None:
        super().__init__(home, port)
        self.jars = Path(jars).absolute()
        self.bootstrap = bootstrap
        self.registry = registry
        self.kafka = dict(kafka or {})
        self.heap = heap

    @classmethod
    def for_settings(cls, settings: Settings, registry: LocalRegistry) -> LocalConnect | None:
        """The worker ``lockstep dev`` manages: ``$LOCKSTEP_HOME/connect`` on LOCKSTEP_CONNECT_URL's
        port, writing to LOCKSTEP_BOOTSTRAP; None if that URL is not on loopback."""
        url = urlparse(settings.connect_url)
        if url.hostname not in (HOST, "localhost"):
            return None
        return cls(settings.home / "connect", settings.jars / "connect", url.port or DEFAULT_PORT,
                   settings.bootstrap, registry, settings.kafka_security.java_properties())

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def properties_file(self) -> Path:
        return self.home / "worker.properties"

    def prepare(self) -> None:
        self.require_jars(self.jars, "connect-runtime-*.jar", "Kafka Connect")
        clients = {f"{role}{key}": value for role in ("", "producer.", "consumer.") for key, value in self.kafka.items()}
        worker = {
            "bootstrap.servers": self.bootstrap,
            **converter(self.registry),
            "offset.storage.file.filename": str(self.home / "offsets"),
            "offset.flush.interval.ms": "1000",
            "listeners": self.url,
            "plugin.discovery": "only_scan",  # plugins are on the classpath; no manifests to look for
            **clients,  # the broker's security, for the worker and its producers and consumers
        }
        self.properties_file.write_text("".join(f"{key}={value}\n" for key, value in worker.items()))

    def command(self) -> list[str]:
        return self.java(self.jars, self.heap, str(self.properties_file))

    def answers(self) -> bool:
        try:
            return bool(self._call("GET", "/").get("version"))
        except ConnectError as exc:
            self.last_error = str(exc)
            return False

    def up(self, timeout: float = 90.0) -> int:
        """Start the worker unless ours already runs; returns its pid once its REST API answers."""
        return self.start(timeout)

    def add(self, connector: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /connectors``: add a connector (``{"name": ..., "config": {...}}``)."""
        return self._call("POST", "/connectors", connector)

    def status(self, name: str) -> dict[str, Any]:
        """``GET /connectors/NAME/status``: the connector's and its tasks' states."""
        return self._call("GET", f"/connectors/{name}/status")

    def remove(self, name: str) -> None:
        """``DELETE /connectors/NAME``."""
        self._call("DELETE", f"/connectors/{name}")

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            raise ConnectError(f"Kafka Connect {method} {path}: {exc.code} {exc.read().decode(errors='replace')}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectError(f"Kafka Connect at {self.url} does not answer: {exc}") from exc
        return json.loads(text) if text else {}
