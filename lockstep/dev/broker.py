"""A single-node KRaft Kafka broker on 127.0.0.1, run from the jars ``scripts/setup`` cached.

``lockstep dev up|down|status`` and the test fixtures both use this class, so tests run
against exactly the broker a developer gets.

Example::

    broker = LocalBroker(home=Path(".lockstep/kafka"), jars=Path(".lockstep/jars/kafka"), port=9092)
    broker.up()        # formats the storage the first time, returns once metadata answers
    broker.status()    # BrokerStatus(running=True, pid=..., bootstrap='127.0.0.1:9092', topics=0)
    broker.down()      # SIGTERM, wait, SIGKILL if needed

With ``users={"admin": "...", "jobs": "..."}`` it authenticates every client with SASL/PLAIN
and authorises with ACLs (KRaft's StandardAuthorizer; ``admin`` is the super user that grants
them): the secured cluster the security tests run against.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from coordinator.settings import KafkaSecurity, Settings
from lockstep.dev.service import HOST, LocalService, ServiceError, free_port, port_in_use, process_alive, wait_exit

__all__ = ["HOST", "BrokerError", "BrokerStatus", "LocalBroker", "LocalKafkaCluster", "free_port", "port_in_use",
           "process_alive", "topic_count"]

MAIN_CLASS = "kafka.Kafka"
SUPER_USER = "admin"


class BrokerError(ServiceError):
    """The local broker could not be started or stopped; the message says why and what to do."""


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap: str
    topics: int | None


def topic_count(bootstrap: str, timeout: float = 2.0, client: Mapping[str, str] | None = None) -> int:
    """Number of non-internal topics; raises KafkaException if the broker does not answer."""
    # log_level 0: a broker that is down is an answer here, not something to print 20 times.
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **(client or {})})
    metadata = admin.list_topics(timeout=timeout)
    return sum(1 for name in metadata.topics if not name.startswith("__"))


class LocalBroker(LocalService):
    """Owns one broker's directory: config, data, log and pid file under ``home``."""

    name = "broker"
    main_class = MAIN_CLASS
    error = BrokerError
    port_setting = f"LOCKSTEP_BOOTSTRAP={HOST}:<port>"

    def __init__(self, home: Path, jars: Path, port: int = 9092, heap: str = "512m",
                 users: Mapping[str, str] | None = None, node_id: int = 1, quorum: Mapping[int, int] | None = None,
                 cluster_id: str | None = None) -> None:
        super().__init__(home, port)
        self.jars = Path(jars).absolute()
        self.heap = heap
        self.node_id = node_id
        self.quorum = dict(quorum or {})  # node id -> controller port of every node (empty: a single node)
        self.cluster_id = cluster_id
        self.users = dict(users or {})  # SASL/PLAIN user -> password; empty: no authentication
        if self.users and SUPER_USER not in self.users:
            raise BrokerError(f"a secured broker needs the user {SUPER_USER!r}: it is the super user that grants ACLs")
        if any(not user.isidentifier() or not password.isalnum() for user, password in self.users.items()):
            raise BrokerError("users of a local broker are identifiers with alphanumeric passwords "
                              "(they are written into its JAAS config as they are)")

    @classmethod
    def for_settings(cls, settings: Settings) -> LocalBroker | None:
        """The broker ``lockstep dev`` and ``lockstep demo`` manage: ``$LOCKSTEP_HOME/kafka`` on
        LOCKSTEP_BOOTSTRAP's port; None if LOCKSTEP_BOOTSTRAP is not on loopback."""
        if settings.bootstrap_host not in (HOST, "localhost"):
            return None
        return cls(home=settings.home / "kafka", jars=settings.jars / "kafka", port=settings.bootstrap_port)

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def client_config(self, user: str = SUPER_USER) -> dict[str, str]:
        """confluent-kafka settings (bootstrap and security) for ``user`` of this broker."""
        config = {"bootstrap.servers": self.bootstrap}
        if self.users:
            config |= {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                       "sasl.username": user, "sasl.password": self.users[user]}
        return config

    def env(self, user: str = SUPER_USER) -> dict[str, str]:
        """``LOCKSTEP_*`` variables that make a Lockstep process a client of this broker as ``user``."""
        return {"LOCKSTEP_BOOTSTRAP": self.bootstrap,
                **{"LOCKSTEP_KAFKA_" + k.upper().replace(".", "_"): v
                   for k, v in self.client_config(user).items() if k != "bootstrap.servers"}}

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def config_file(self) -> Path:
        return self.home / "server.properties"

    @property
    def marker(self) -> str:
        return str(self.config_file)

    # -- lifecycle -------------------------------------------------------------------

    def up(self, timeout: float = 90.0) -> BrokerStatus:
        """Start the broker unless ours already runs; return once a metadata request succeeds."""
        self.start(timeout)
        return self.status()

    def prepare(self) -> None:
        self._check_jars()
        self._write_config(self.quorum or {self.node_id: free_port(exclude=frozenset({self.port}))})
        if not (self.data_dir / "meta.properties").exists():
            self._format()

    def command(self) -> list[str]:
        return self._java(MAIN_CLASS, str(self.config_file))

    def answers(self) -> bool:
        try:
            topic_count(self.bootstrap, timeout=1.0, client=self.client_config())
        except KafkaException as exc:  # not up yet
            self.last_error = str(exc)
            return False
        return True

    def status(self) -> BrokerStatus:
        pid = self.running_pid()
        topics = None
        if pid is not None:
            try:
                topics = topic_count(self.bootstrap, client=self.client_config())
            except KafkaException:  # running but not answering (yet): say so with topics=None
                topics = None
        return BrokerStatus(running=pid is not None, pid=pid, bootstrap=self.bootstrap, topics=topics)

    # -- internals -------------------------------------------------------------------

    def _check_jars(self) -> None:
        self.require_jars(self.jars, "kafka_2.13-*.jar", "Kafka broker")

    def _java(self, main_class: str, *args: str) -> list[str]:
        log4j = self.home / "log4j.properties"
        return [
            "java",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{log4j}",
            f"-Dkafka.logs.dir={self.home / 'logs'}",
            "-cp",
            f"{self.jars}/*",
            main_class,
            *args,
        ]

    def _write_config(self, voters: Mapping[int, int]) -> None:
        controller_port = voters[self.node_id]
        replicas = min(3, len(voters))  # Kafka's internal topics: replicated across the cluster
        self.config_file.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    f"node.id={self.node_id}",
                    "controller.quorum.voters=" + ",".join(f"{n}@{HOST}:{p}" for n, p in sorted(voters.items())),
                    *self._listeners(controller_port),
                    f"log.dirs={self.data_dir}",
                    "num.partitions=1",
                    f"offsets.topic.replication.factor={replicas}",
                    "offsets.topic.num.partitions=4",
                    f"transaction.state.log.replication.factor={replicas}",
                    f"transaction.state.log.min.isr={max(1, replicas - 1)}",
                    "transaction.state.log.num.partitions=4",
                    "group.initial.rebalance.delay.ms=0",
                    # A dev broker should compact promptly so compaction is observable.
                    "log.cleaner.backoff.ms=1000",
                    "auto.create.topics.enable=false",
                    "",
                ]
            )
        )
        (self.home / "log4j.properties").write_text(
            "log4j.rootLogger=WARN, stdout\n"
            "log4j.logger.kafka.server.KafkaServer=INFO\n"
            "log4j.logger.kafka.server.KafkaRaftServer=INFO\n"
            "log4j.logger.kafka.log.LogCleaner=INFO\n"
            "log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
        )

    def _listeners(self, controller_port: int) -> list[str]:
        if not self.users:
            return [
                f"listeners=PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{controller_port}",
                f"advertised.listeners=PLAINTEXT://{HOST}:{self.port}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            ]
        # The broker and its controller talk SASL too, as the super user: no listener is open.
        own = KafkaSecurity("SASL_PLAINTEXT", "PLAIN", SUPER_USER, self.users[SUPER_USER])
        accounts = " ".join(f'user_{user}="{password}"' for user, password in self.users.items())
        jaas = own.java_properties()["sasl.jaas.config"].removesuffix(";") + f" {accounts};"
        return [
            f"listeners=SASL_PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{controller_port}",
            f"advertised.listeners=SASL_PLAINTEXT://{HOST}:{self.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=SASL_PLAINTEXT",
            "listener.security.protocol.map=SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms=PLAIN",
            "sasl.mechanism.inter.broker.protocol=PLAIN",
            "sasl.mechanism.controller.protocol=PLAIN",
            f"listener.name.sasl_plaintext.plain.sasl.jaas.config={jaas}",
            f"listener.name.controller.plain.sasl.jaas.config={jaas}",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            f"super.users=User:{SUPER_USER}",
        ]

    def _format(self) -> None:
        cluster_id = self.cluster_id or new_cluster_id()
        result = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(self.config_file)),
            capture_output=True,
            text=True,
            cwd=self.home,
        )
        if result.returncode != 0:
            raise BrokerError(f"formatting the broker storage failed:\n{result.stdout}{result.stderr}")


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64, never starting with '-'
    (Kafka's own generator avoids that too: a leading '-' reads as a command-line flag)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


class LocalKafkaCluster:
    """``len(ports)`` KRaft nodes on 127.0.0.1, each broker and controller, under ``home/node-N``:
    the cluster ``lockstep dev up --brokers 3`` runs. The cluster id and the controllers' ports
    are chosen once and kept in ``home/cluster.json``, so a node stopped or killed starts again
    into the same quorum.

    Example::

        kafka = LocalKafkaCluster(Path(".lockstep/kafka-cluster"), Path(".lockstep/jars/kafka"), [9092, 9093, 9094])
        kafka.up()                     # every node, then waits until each answers
        kafka.kill(kafka.controller_id(), signal.SIGKILL); kafka.node(1).up()
        kafka.down()
    """

    def __init__(self, home: Path, jars: Path, ports: Sequence[int], heap: str = "384m") -> None:
        if len(set(ports)) != len(ports) or not ports:
            raise BrokerError(f"a cluster needs distinct ports, one per node; got {list(ports)}")
        self.home = Path(home).absolute()
        self.jars = Path(jars).absolute()
        self.ports = list(ports)
        self.heap = heap

    @classmethod
    def for_settings(cls, settings: Settings, brokers: int | None = None) -> LocalKafkaCluster | None:
        """The cluster ``lockstep dev`` manages: ``$LOCKSTEP_HOME/kafka-cluster`` on the ports
        LOCKSTEP_BOOTSTRAP lists (or its first port and the next ones). With ``brokers`` None,
        the cluster made there before, if any. None off loopback."""
        home, jars = settings.home / "kafka-cluster", settings.jars / "kafka"
        if settings.bootstrap_host not in (HOST, "localhost"):
            return None
        if brokers is None:
            layout = home / "cluster.json"
            return cls(home, jars, json.loads(layout.read_text())["ports"]) if layout.exists() else None
        listed = [int(hp.rsplit(":", 1)[1]) for hp in settings.bootstrap.split(",")]
        ports = listed if len(listed) == brokers else [settings.bootstrap_port + i for i in range(brokers)]
        return cls(home, jars, ports)

    @property
    def node_ids(self) -> list[int]:
        return list(range(1, len(self.ports) + 1))

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{HOST}:{port}" for port in self.ports)

    def _layout(self) -> tuple[str, dict[int, int]]:
        """(cluster id, node id -> controller port), chosen once and then read back."""
        file = self.home / "cluster.json"
        if file.exists():
            layout = json.loads(file.read_text())
            if layout.get("ports") == self.ports:
                return layout["cluster_id"], {int(k): int(v) for k, v in layout["controllers"].items()}
            raise BrokerError(f"{self.home} holds a cluster on ports {layout.get('ports')}, not {self.ports}; "
                              f"use those ports or remove {self.home}")
        taken = set(self.ports)
        controllers = {}
        for node in self.node_ids:
            controllers[node] = free_port(exclude=frozenset(taken))
            taken.add(controllers[node])
        cluster_id = new_cluster_id()
        self.home.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps({"cluster_id": cluster_id, "ports": self.ports, "controllers": controllers}))
        return cluster_id, controllers

    def node(self, node_id: int) -> LocalBroker:
        cluster_id, controllers = self._layout()
        return LocalBroker(self.home / f"node-{node_id}", self.jars, self.ports[node_id - 1], self.heap,
                           node_id=node_id, quorum=controllers, cluster_id=cluster_id)

    def up(self, timeout: float = 120.0) -> list[BrokerStatus]:
        """Start every node that is not running, then wait until each answers."""
        nodes = [self.node(n) for n in self.node_ids]
        pids = [node.running_pid() or node.launch() for node in nodes]
        try:
            for node, pid in zip(nodes, pids, strict=True):
                node.wait_ready(pid, timeout)
        except BrokerError:
            self.down()
            raise
        return [node.status() for node in nodes]

    def down(self) -> bool:
        """Stop every node this checkout started; True if any was running."""
        if not (self.home / "cluster.json").exists():
            return False
        with ThreadPoolExecutor(len(self.ports)) as pool:  # together: a node alone waits for the quorum to shut down
            return any(list(pool.map(lambda n: self.node(n).down(), self.node_ids)))

    def status(self) -> list[BrokerStatus]:
        return [self.node(n).status() for n in self.node_ids]

    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a running node (drills: SIGKILL a broker, SIGSTOP a controller)."""
        pid = self.node(node_id).running_pid()
        if pid is None:
            raise BrokerError(f"node {node_id} of {self.home} is not running")
        os.kill(pid, sig)
        if sig == signal.SIGKILL:
            wait_exit(pid, 30.0)

    def controller_id(self) -> int:
        """The node id of the active controller, as the cluster reports it."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})  # held until the answer came
        return int(admin.describe_cluster().result(timeout=30).controller.id)
