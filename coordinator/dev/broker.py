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
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from coordinator.domain.errors import NotStarted
from coordinator.settings import KafkaSecurity, Settings

HOST = "127.0.0.1"
MAIN_CLASS = "kafka.Kafka"
SUPER_USER = "admin"


class BrokerError(NotStarted):
    """The local broker could not be started or stopped; the message says why and what to do."""


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap: str
    topics: int | None


def free_port(exclude: frozenset[int] = frozenset()) -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now and that is not in ``exclude``.

    The OS may hand out a just-released port again, so a caller that needs two distinct
    ports passes the first one in ``exclude``.
    """
    while True:
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = int(s.getsockname()[1])
        if port not in exclude:
            return port


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def topic_count(bootstrap: str, timeout: float = 2.0, client: Mapping[str, str] | None = None) -> int:
    """Number of non-internal topics; raises KafkaException if the broker does not answer."""
    # log_level 0: a broker that is down is an answer here, not something to print 20 times.
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **(client or {})})
    metadata = admin.list_topics(timeout=timeout)
    return sum(1 for name in metadata.topics if not name.startswith("__"))


class LocalBroker:
    """Owns one broker's directory: config, data, log and pid file under ``home``."""

    def __init__(self, home: Path, jars: Path, port: int = 9092, heap: str = "512m",
                 users: Mapping[str, str] | None = None) -> None:
        self.home = Path(home).absolute()
        self.jars = Path(jars).absolute()
        self.port = port
        self.heap = heap
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
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "broker.log"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def config_file(self) -> Path:
        return self.home / "server.properties"

    # -- lifecycle -------------------------------------------------------------------

    def up(self, timeout: float = 90.0) -> BrokerStatus:
        """Start the broker unless ours already runs; return once a metadata request succeeds."""
        pid = self.running_pid()
        if pid is not None:
            self.wait_ready(pid, timeout)
            return self.status()
        if port_in_use(self.port):
            raise BrokerError(
                f"port {self.port} on {HOST} is already in use by another process, not by a "
                f"Lockstep broker under {self.home}. Stop that process, or pick a free port with "
                f"LOCKSTEP_BOOTSTRAP={HOST}:<port>."
            )
        self._check_jars()
        self.home.mkdir(parents=True, exist_ok=True)
        self._write_config(controller_port=free_port(exclude=frozenset({self.port})))
        if not (self.data_dir / "meta.properties").exists():
            self._format()
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                self._java(MAIN_CLASS, str(self.config_file)),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.home,
            )
        self.pid_file.write_text(str(proc.pid))
        try:
            self.wait_ready(proc.pid, timeout)
        except BrokerError:
            self.down()
            raise
        return self.status()

    def down(self, timeout: float = 30.0) -> bool:
        """Stop our broker by its pid; True if one was running. Never touches other processes."""
        pid = self.running_pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        if not _wait_exit(pid, timeout):
            os.kill(pid, signal.SIGKILL)
            _wait_exit(pid, 10.0)
        self.pid_file.unlink(missing_ok=True)
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

    def running_pid(self) -> int | None:
        """The pid in our pid file if that process is alive and is our broker."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if MAIN_CLASS.encode() in cmdline and str(self.config_file).encode() in cmdline:
            return pid
        return None

    def wait_ready(self, pid: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if not process_alive(pid):
                raise BrokerError(f"the broker exited during start-up.\n{self._log_tail()}")
            try:
                topic_count(self.bootstrap, timeout=1.0, client=self.client_config())
                return
            except KafkaException as exc:  # not up yet
                last_error = exc
                time.sleep(0.3)
        raise BrokerError(
            f"the broker did not answer on {self.bootstrap} within {timeout:.0f}s "
            f"(last error: {last_error}).\n{self._log_tail()}"
        )

    # -- internals -------------------------------------------------------------------

    def _check_jars(self) -> None:
        if not any(self.jars.glob("kafka_2.13-*.jar")):
            raise BrokerError(
                f"no Kafka broker jars in {self.jars}. Run scripts/setup from the repository "
                "root, or point LOCKSTEP_JARS at the folder that holds kafka/ and spark/."
            )

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

    def _write_config(self, controller_port: int) -> None:
        self.config_file.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@{HOST}:{controller_port}",
                    *self._listeners(controller_port),
                    f"log.dirs={self.data_dir}",
                    "num.partitions=1",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=4",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
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
        cluster_id = new_cluster_id()
        result = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(self.config_file)),
            capture_output=True,
            text=True,
            cwd=self.home,
        )
        if result.returncode != 0:
            raise BrokerError(f"formatting the broker storage failed:\n{result.stdout}{result.stderr}")

    def _log_tail(self, lines: int = 20) -> str:
        try:
            tail = self.log_file.read_text(errors="replace").splitlines()[-lines:]
        except FileNotFoundError:
            return f"(no log at {self.log_file})"
        return f"last lines of {self.log_file}:\n" + "\n".join(tail)


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64, never starting with '-'
    (Kafka's own generator avoids that too: a leading '-' reads as a command-line flag)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours still "exists"; treat it as gone.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    if state == "Z":
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True


def _wait_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.1)
    return not process_alive(pid)
