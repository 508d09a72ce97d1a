"""One typed settings object, read from ``LOCKSTEP_*`` environment variables.

Every process (CLI, worker, Spark jobs, tests) builds its configuration here, once, and passes
it on, so that a variable means the same thing everywhere; nothing else reads ``LOCKSTEP_*``.
A bad value is a ``SettingsError`` naming the variable and what it must look like.

Example::

    >>> s = Settings.from_env({"LOCKSTEP_BOOTSTRAP": "127.0.0.1:19092"})
    >>> s.bootstrap_host, s.bootstrap_port
    ('127.0.0.1', 19092)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from coordinator.domain.barriers import BarrierConfig
from coordinator.domain.errors import UsageError
from coordinator.domain.leases import LeaseLimits
from coordinator.installed import Installed

KAFKA_PASSTHROUGH_PREFIX = "LOCKSTEP_KAFKA_"
KafkaValue = str | int | float | bool  # what a confluent-kafka config value may be
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")  # what all three client stacks speak
CRASH_POINTS = ("before_commit", "after_write_files", "before_completion", "after_state_commit", "pause_before_announce",
                "hang_before_commit")
SPARK_LOG_LEVELS = ("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF", "TRACE")


class SettingsError(UsageError, ValueError):
    """A ``LOCKSTEP_*`` variable has a value that cannot be used."""


@dataclass(frozen=True)
class CrashAt:
    """Drills only (``LOCKSTEP_CRASH_AT=before_commit:0.3``): a process stops itself at ``point``
    with probability ``chance`` (``coordinator.faults``)."""

    point: str
    chance: float = 1.0


@dataclass(frozen=True)
class KafkaSecurity:
    """How every Kafka client of Lockstep authenticates, read once from ``LOCKSTEP_KAFKA_*``
    (librdkafka's names) so that the three client stacks, confluent-kafka, the Faust worker's
    aiokafka and Spark's Java Kafka source, connect the same way.

    Example::

        >>> s = Settings.from_env({"LOCKSTEP_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        ...     "LOCKSTEP_KAFKA_SASL_USERNAME": "jobs", "LOCKSTEP_KAFKA_SASL_PASSWORD": 'p"w'})
        >>> s.kafka_security.java_properties()["sasl.jaas.config"]
        'org.apache.kafka.common.security.plain.PlainLoginModule required username="jobs" password="p\\\\"w";'
    """

    protocol: str = "PLAINTEXT"
    mechanism: str | None = None  # SASL only
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # never in a repr, a log line or an error
    ca_location: str | None = None  # TLS: the CA certificates (PEM) that signed the brokers' certificates

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    def java_properties(self) -> dict[str, str]:
        """The same security for a Java Kafka client (Spark's Kafka source adds ``kafka.``)."""
        properties = {"security.protocol": self.protocol}
        if self.sasl:
            module = "plain.PlainLoginModule" if self.mechanism == "PLAIN" else "scram.ScramLoginModule"
            properties["sasl.mechanism"] = str(self.mechanism)
            properties["sasl.jaas.config"] = (f"org.apache.kafka.common.security.{module} required "
                                              f"username={_jaas_quoted(self.username)} "
                                              f"password={_jaas_quoted(self.password)};")
        if self.tls and self.ca_location:
            properties |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": self.ca_location}
        return properties


@dataclass(frozen=True)
class S3Access:
    """How Spark reaches an S3-API store for an ``s3a://`` warehouse: ``LOCKSTEP_S3_ENDPOINT``
    (an S3-compatible server such as ``lockstep dev up --s3``; unset: AWS itself) and
    ``LOCKSTEP_S3_ACCESS_KEY`` / ``LOCKSTEP_S3_SECRET_KEY`` (unset: Hadoop's default chain of
    credential providers: AWS_* variables, profiles, instance roles).

    Example::

        >>> S3Access("http://127.0.0.1:9000", "k", "s").hadoop_conf()["fs.s3a.path.style.access"]
        'true'
    """

    endpoint: str | None = None
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)

    def hadoop_conf(self) -> dict[str, str]:
        """``fs.s3a.*`` settings (Spark takes them as ``spark.hadoop.fs.s3a.*``)."""
        conf: dict[str, str] = {}
        if self.endpoint:
            # an S3-compatible server: bucket in the path, plain HTTP where the URL says so
            # bulk deletes off: the SDK's DeleteObjects carries a checksum header that S3-compatible
            # servers (s3proxy among them) refuse with 501 NotImplemented
            conf |= {"fs.s3a.endpoint": self.endpoint, "fs.s3a.path.style.access": "true",
                     "fs.s3a.connection.ssl.enabled": str(self.endpoint.startswith("https:")).lower(),
                     "fs.s3a.endpoint.region": "us-east-1", "fs.s3a.multiobjectdelete.enable": "false"}
        if self.access_key and self.secret_key:
            conf |= {"fs.s3a.access.key": self.access_key, "fs.s3a.secret.key": self.secret_key,
                     "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"}
        return conf


def _listen_address(text: str, listed_in: str | None = None) -> tuple[str, int]:
    """(host, port) of one coordinator URL (of the list ``listed_in``), or a ``SettingsError``
    that shows the form."""
    url = urlparse(text)
    try:
        port = url.port
    except ValueError:
        port = None
    if url.scheme not in ("http", "https") or not url.hostname or (port is None and url.netloc.count(":")):
        which = f"{listed_in!r}: {text!r}" if listed_in not in (None, text) else repr(text)
        raise SettingsError(f"LOCKSTEP_COORDINATOR_URL={which} is not http://host[:port]; set it like "
                            "LOCKSTEP_COORDINATOR_URL=http://127.0.0.1:6066 (several workers: comma-separated)")
    return url.hostname, port or 6066


@dataclass(frozen=True)
class Settings:
    """Where things are, how to reach them, and the knobs of barriers, Spark and drills."""

    bootstrap: str = "127.0.0.1:9092"
    home: Path = Path(".lockstep")
    warehouse: str = ".lockstep/warehouse"  # a folder, or a Hadoop URI (s3a://bucket/prefix); see table_location
    s3: S3Access = S3Access()
    metastore: str = ""  # a Hive metastore that names the tables (jdbc:derby://... or thrift://...); "": paths only
    jars: Path = Path(".lockstep/jars")
    coordinator_url: str = "http://127.0.0.1:6066"
    topic_prefix: str = "lockstep"
    replication_factor: int = 1
    kafka_client: Mapping[str, str] = field(default_factory=dict, repr=False)  # holds the SASL password
    retain_barriers: int = 100  # vacuum keeps the exact points of this many newest barriers
    barriers: BarrierConfig = BarrierConfig()  # spacing, backpressure, liveness, catch-up stride
    leases: LeaseLimits = LeaseLimits()  # readers' and jobs' leases: ttl, per holder, in all
    schemas: Path | None = None  # the Avro schemas; None: schemas/ of this checkout
    spark_master: str = "local[2]"
    spark_log_level: str | None = None  # None: WARN (the demo's live view asks for ERROR)
    driver_jvm_options: str = ""  # more options for the Spark driver's JVM, e.g. -XX:TieredStopAtLevel=1
    openlineage: str = ""  # where jobs send OpenLineage run events: console, file:PATH, http(s)://URL; "": nowhere
    crash_at: CrashAt | None = None
    compact_every: int = 100  # a job compacts its table's small files after every this many commits (0: never)
    vacuum_every_s: int = 600  # `lockstep run` vacuums its jobs' tables this often (0: never)
    stuck_after_s: int = 60  # a job with barriers waiting and no progress this long is restarted (0: never)
    fuse_jobs: bool = True  # jobs of one `lockstep run` that read only its tables share one streaming query
    log_retention_hours: int = 24  # Delta log entries older than this (rounded down to midnight) go at a checkpoint
    schema_registry_url: str = ""  # a Confluent-compatible schema registry (formats avro-confluent, ...); "": none
    connect_url: str = "http://127.0.0.1:8083"  # Kafka Connect's REST API (`lockstep dev up --connect` runs one)
    postgres_url: str = "postgresql://postgres@127.0.0.1:5432/lockstep"  # the source database of `dev up --postgres`
    serve_password: str = field(default="", repr=False)  # `lockstep serve`: what clients off loopback must prove
    installed: Installed = field(default=Installed(), compare=False)  # what scripts/setup recorded

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, kafka: bool = True,
                 installed: Installed | None = None) -> Settings:
        """Read the environment (``os.environ`` by default); relative paths stay relative to cwd.
        The home and the jars are LOCKSTEP_HOME and LOCKSTEP_JARS, else where ``scripts/setup``
        recorded them (``installed``, default: this virtualenv's record), else under ``./.lockstep``.

        ``kafka=False`` leaves LOCKSTEP_BOOTSTRAP and LOCKSTEP_KAFKA_* unchecked until
        ``check_kafka()``: a command that never reaches Kafka must not fail on them."""
        env = os.environ if env is None else env
        installed = Installed.read() if installed is None else installed
        home = Path(env.get("LOCKSTEP_HOME") or installed.home or ".lockstep")
        settings = cls(
            bootstrap=env.get("LOCKSTEP_BOOTSTRAP", "127.0.0.1:9092"),
            home=home,
            warehouse=_warehouse(env.get("LOCKSTEP_WAREHOUSE") or str(home / "warehouse")),
            s3=_s3_access(env),
            metastore=_metastore(env.get("LOCKSTEP_METASTORE", "")),
            jars=Path(env.get("LOCKSTEP_JARS") or installed.jars or home / "jars"),
            coordinator_url=env.get("LOCKSTEP_COORDINATOR_URL", "http://127.0.0.1:6066"),
            topic_prefix=env.get("LOCKSTEP_TOPIC_PREFIX", "lockstep"),
            replication_factor=_whole_number(env, "LOCKSTEP_REPLICATION_FACTOR", 1),
            kafka_client=kafka_passthrough(env),
            retain_barriers=_whole_number(env, "LOCKSTEP_RETAIN_BARRIERS", 100, minimum=0),
            barriers=BarrierConfig(
                interval_ms=_whole_number(env, "LOCKSTEP_BARRIER_INTERVAL_MS", BarrierConfig.interval_ms),
                max_inflight=_whole_number(env, "LOCKSTEP_BARRIER_MAX_INFLIGHT", BarrierConfig.max_inflight),
                liveness_ms=_whole_number(env, "LOCKSTEP_JOB_LIVENESS_MS", BarrierConfig.liveness_ms),
                catchup_stride=_whole_number(env, "LOCKSTEP_BARRIER_CATCHUP_STRIDE", BarrierConfig.catchup_stride),
                stride_after=_whole_number(env, "LOCKSTEP_BARRIER_STRIDE_AFTER", BarrierConfig.stride_after, minimum=0),
            ),
            leases=LeaseLimits(
                max_ttl_ms=_whole_number(env, "LOCKSTEP_LEASE_MAX_TTL_MS", LeaseLimits.max_ttl_ms),
                per_holder=_whole_number(env, "LOCKSTEP_LEASE_PER_HOLDER", LeaseLimits.per_holder),
                total=_whole_number(env, "LOCKSTEP_LEASE_TOTAL", LeaseLimits.total),
            ),
            schemas=Path(env["LOCKSTEP_SCHEMAS"]) if env.get("LOCKSTEP_SCHEMAS") else None,
            spark_master=env.get("LOCKSTEP_SPARK_MASTER") or "local[2]",
            spark_log_level=_spark_log_level(env.get("LOCKSTEP_SPARK_LOG_LEVEL")),
            driver_jvm_options=_jvm_options(env.get("LOCKSTEP_DRIVER_JVM_OPTIONS", "")),
            openlineage=_openlineage(env.get("LOCKSTEP_OPENLINEAGE", "")),
            crash_at=_crash_at(env.get("LOCKSTEP_CRASH_AT")),
            compact_every=_whole_number(env, "LOCKSTEP_COMPACT_EVERY", 100, minimum=0),
            vacuum_every_s=_whole_number(env, "LOCKSTEP_VACUUM_EVERY_S", 600, minimum=0),
            stuck_after_s=_whole_number(env, "LOCKSTEP_STUCK_AFTER_S", 60, minimum=0),
            fuse_jobs=_switch(env, "LOCKSTEP_FUSE_JOBS", True),
            log_retention_hours=_whole_number(env, "LOCKSTEP_LOG_RETENTION_HOURS", 24),
            schema_registry_url=_http_url(env, "LOCKSTEP_SCHEMA_REGISTRY_URL", "",
                                          "http://127.0.0.1:8081/apis/ccompat/v7"),
            connect_url=_http_url(env, "LOCKSTEP_CONNECT_URL", "http://127.0.0.1:8083", "http://127.0.0.1:8083"),
            postgres_url=_postgres_url(env.get("LOCKSTEP_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/lockstep")),
            serve_password=env.get("LOCKSTEP_SERVE_PASSWORD", ""),
            installed=installed,
        )
        if kafka:
            settings.check_kafka()  # validate early, with a message that names the variable
        _ = settings.coordinator_port
        return settings

    def check_kafka(self) -> Settings:
        """``self``, or a ``SettingsError`` naming the Kafka variable (LOCKSTEP_BOOTSTRAP,
        LOCKSTEP_KAFKA_*) that cannot be used; the one check for every Kafka client."""
        _ = self.bootstrap_port
        _ = self.kafka_security
        return self

    @property
    def warehouse_is_local(self) -> bool:
        """Whether the warehouse is a folder of this machine (no scheme, or ``file:``)."""
        return "://" not in str(self.warehouse) or str(self.warehouse).startswith("file:")

    def table_location(self, name: str) -> str:
        """Where the Delta table ``name`` lives: an absolute path for a local warehouse (relative
        ones are relative to the current directory), else a URI under the warehouse's.

        >>> Settings(warehouse="s3a://lake/wh/").table_location("orders")
        's3a://lake/wh/orders'
        >>> Settings(warehouse="/data/wh").table_location("orders")
        '/data/wh/orders'
        """
        if self.warehouse_is_local:
            return str(Path(str(self.warehouse).removeprefix("file:")).absolute() / name)
        return f"{str(self.warehouse).rstrip('/')}/{name}"

    def catalog_conf(self) -> dict[str, str]:
        """Spark settings that make the session catalog Hive's, kept in ``LOCKSTEP_METASTORE``
        (empty without one: tables are known by path only).

        >>> Settings(metastore="thrift://meta:9083").catalog_conf()["spark.hadoop.hive.metastore.uris"]
        'thrift://meta:9083'
        """
        if not self.metastore:
            return {}
        conf = {"spark.sql.catalogImplementation": "hive"}
        if self.metastore.startswith("thrift://"):
            return conf | {"spark.hadoop.hive.metastore.uris": self.metastore}
        url = self.metastore if ";create=" in self.metastore else self.metastore + ";create=true"
        return conf | {
            "spark.hadoop.javax.jdo.option.ConnectionURL": url,
            "spark.hadoop.javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.ClientDriver",
            # the first session to connect creates the metastore's tables; no schema version check
            "spark.hadoop.datanucleus.schema.autoCreateAll": "true",
            "spark.hadoop.hive.metastore.schema.verification": "false",
        }

    @property
    def checkpoints(self) -> Path:
        """Where the jobs' streaming checkpoints live: a folder of the machine that runs the Spark
        driver, a folder in it per coordinator prefix and table (``spark_jobs.ops.tables.checkpoint_location``)."""
        return (self.home / "checkpoints").absolute()

    @property
    def bootstrap_host(self) -> str:
        return self.bootstrap.split(",")[0].rsplit(":", 1)[0]

    @property
    def bootstrap_port(self) -> int:
        first = self.bootstrap.split(",")[0]
        host, sep, port = first.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise SettingsError(
                f"LOCKSTEP_BOOTSTRAP={self.bootstrap!r} is not host:port; "
                "set it like LOCKSTEP_BOOTSTRAP=127.0.0.1:9092"
            )
        return int(port)

    @property
    def coordinator_urls(self) -> tuple[str, ...]:
        """Every coordinator worker a client may ask, in order: ``LOCKSTEP_COORDINATOR_URL`` lists
        them comma-separated, as a bootstrap list does brokers, so reads outlive one worker.

        >>> Settings(coordinator_url="http://127.0.0.1:6066, http://127.0.0.1:6067").coordinator_urls
        ('http://127.0.0.1:6066', 'http://127.0.0.1:6067')
        """
        urls = tuple(url.strip() for url in self.coordinator_url.split(",") if url.strip())
        for url in urls or ("",):
            _listen_address(url, self.coordinator_url)
        return urls

    @property
    def page_url(self) -> str:
        """The live page of the first coordinator worker (served on its REST port).

        >>> Settings(coordinator_url="http://127.0.0.1:6066/, http://127.0.0.1:6067").page_url
        'http://127.0.0.1:6066/'
        """
        return self.coordinator_urls[0].rstrip("/") + "/"

    @property
    def coordinator_host(self) -> str:
        """The host a worker serves its REST API on: the first URL's."""
        return _listen_address(self.coordinator_urls[0])[0]

    @property
    def coordinator_port(self) -> int:
        """The port a worker serves its REST API on: the first URL's (6066 if it names none)."""
        return _listen_address(self.coordinator_urls[0])[1]

    @property
    def kafka_security(self) -> KafkaSecurity:
        """The security part of ``LOCKSTEP_KAFKA_*``, checked (``SettingsError`` says what is missing)."""
        return _kafka_security(self.kafka_client)

    def kafka_config(self, extra: Mapping[str, KafkaValue] | None = None, client: str = "lockstep") -> dict[str, KafkaValue]:
        """confluent-kafka client config: bootstrap, ``client.id`` (librdkafka names its log lines
        after it: ``lockstep-state#consumer-3``), ``LOCKSTEP_KAFKA_*`` pass-through, ``extra``.

        >>> Settings().kafka_config({"linger.ms": 0}, client="lockstep-completions")["client.id"]
        'lockstep-completions'
        """
        return {"bootstrap.servers": self.bootstrap, "client.id": client, **self.kafka_client, **(extra or {})}


def _whole_number(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = env.get(name, str(default))
    if not raw.isdigit() or int(raw) < minimum:
        raise SettingsError(f"{name}={raw!r} must be a whole number >= {minimum}")
    return int(raw)


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "1" if default else "0").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} must be 1 (on) or 0 (off)")


def _warehouse(raw: str) -> str:
    """A folder, or a URI of a Hadoop file system (``s3a://``, ``hdfs://``, ``abfss://``, ...)."""
    scheme = raw.split("://", 1)[0].lower() if "://" in raw else ""
    if scheme in ("s3", "s3n"):
        raise SettingsError(f"LOCKSTEP_WAREHOUSE={raw!r}: Spark reaches S3 through Hadoop's s3a connector; "
                            f"write it as {'s3a://' + raw.split('://', 1)[1]}")
    if scheme and (not scheme.isalnum() or not raw.split("://", 1)[1].strip("/")):
        raise SettingsError(f"LOCKSTEP_WAREHOUSE={raw!r} is neither a folder nor a URI like s3a://bucket/prefix")
    return raw


def _metastore(raw: str) -> str:
    """A Hive metastore: its Derby database over the network, or a metastore service."""
    raw = raw.strip()
    if raw and not raw.startswith(("jdbc:derby://", "thrift://")):
        raise SettingsError(f"LOCKSTEP_METASTORE={raw!r} is neither a Derby network database nor a metastore "
                            "service; set it like LOCKSTEP_METASTORE=jdbc:derby://127.0.0.1:1527/metastore "
                            "(lockstep dev up --metastore) or LOCKSTEP_METASTORE=thrift://host:9083")
    return raw


def _http_url(env: Mapping[str, str], name: str, default: str, example: str) -> str:
    """An http(s) URL without a trailing slash, or ``default`` if the variable is unset."""
    raw = env.get(name, "").strip().rstrip("/")
    if not raw:
        return default
    url = urlparse(raw)
    try:
        _ = url.port
    except ValueError:
        url = url._replace(netloc="")
    if url.scheme not in ("http", "https") or not url.hostname:
        raise SettingsError(f"{name}={raw!r} is not an http(s) URL; set it like {name}={example}")
    return raw


def _postgres_url(raw: str) -> str:
    url = urlparse(raw.strip())
    try:
        _ = url.port
    except ValueError:
        url = url._replace(netloc="")
    if url.scheme not in ("postgresql", "postgres") or not url.hostname or not url.path.strip("/"):
        raise SettingsError(f"LOCKSTEP_POSTGRES_URL={raw!r} is not postgresql://user@host:port/database; set it like "
                            "LOCKSTEP_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/lockstep")
    return raw.strip()


def _s3_access(env: Mapping[str, str]) -> S3Access:
    endpoint = env.get("LOCKSTEP_S3_ENDPOINT") or None
    if endpoint and urlparse(endpoint).scheme not in ("http", "https"):
        raise SettingsError(f"LOCKSTEP_S3_ENDPOINT={endpoint!r} is not http(s)://host:port; "
                            "set it like LOCKSTEP_S3_ENDPOINT=http://127.0.0.1:9000")
    access, secret = env.get("LOCKSTEP_S3_ACCESS_KEY") or None, env.get("LOCKSTEP_S3_SECRET_KEY") or None
    if bool(access) != bool(secret):
        raise SettingsError("set both LOCKSTEP_S3_ACCESS_KEY and LOCKSTEP_S3_SECRET_KEY, or neither "
                            "(then Hadoop's default credential chain applies)")
    return S3Access(endpoint, access, secret)


def _jvm_options(raw: str) -> str:
    """JVM options, each starting with '-' (a stray word would be taken for the main class).

    >>> _jvm_options(" -XX:TieredStopAtLevel=1  -Xmx3g ")
    '-XX:TieredStopAtLevel=1 -Xmx3g'
    """
    options = raw.split()
    stray = [o for o in options if not o.startswith("-")]
    if stray:
        raise SettingsError(f"LOCKSTEP_DRIVER_JVM_OPTIONS={raw!r}: {', '.join(stray)} is not a JVM option; "
                            "give options that start with '-', e.g. LOCKSTEP_DRIVER_JVM_OPTIONS='-XX:TieredStopAtLevel=1'")
    return " ".join(options)


def _openlineage(raw: str) -> str:
    """``LOCKSTEP_OPENLINEAGE``: ``console``, ``file:PATH``, ``http(s)://host[:port][/path]`` or empty (off).

    >>> _openlineage("http://marquez:5000"), _openlineage("")
    ('http://marquez:5000', '')
    """
    value = raw.strip()
    if value in ("", "console") or (value.startswith("file:") and len(value) > len("file:")):
        return value
    if value.startswith(("http://", "https://")) and len(value.split("://", 1)[1].strip("/")) > 0:
        return value
    raise SettingsError(f"LOCKSTEP_OPENLINEAGE={raw!r} is not a transport; set console, file:/path/to/events.jsonl "
                        "or http://host:port (an OpenLineage endpoint, e.g. Marquez), or leave it empty for none")


def _spark_log_level(raw: str | None) -> str | None:
    if not raw:
        return None
    if raw.upper() not in SPARK_LOG_LEVELS:
        raise SettingsError(f"LOCKSTEP_SPARK_LOG_LEVEL={raw!r} is not a Spark log level; "
                            f"use one of {', '.join(SPARK_LOG_LEVELS)}")
    return raw.upper()


def _crash_at(raw: str | None) -> CrashAt | None:
    """``before_commit`` or ``before_commit:0.3`` (point, probability)."""
    if not raw:
        return None
    point, _, chance = raw.partition(":")
    try:
        probability = float(chance or 1)
    except ValueError:
        probability = -1.0
    if point not in CRASH_POINTS or not 0 <= probability <= 1:
        raise SettingsError(f"LOCKSTEP_CRASH_AT={raw!r} must be POINT[:PROBABILITY] with POINT one of "
                            f"{', '.join(CRASH_POINTS)} and PROBABILITY between 0 and 1")
    return CrashAt(point, probability)


def _kafka_security(client: Mapping[str, str]) -> KafkaSecurity:
    protocol = client.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise SettingsError(f"LOCKSTEP_KAFKA_SECURITY_PROTOCOL={protocol!r} is not a Kafka security protocol; "
                            f"use one of {', '.join(SECURITY_PROTOCOLS)}")
    security = KafkaSecurity(protocol=protocol, ca_location=client.get("ssl.ca.location"))
    if not security.sasl:
        return security
    mechanism = (client.get("sasl.mechanism") or client.get("sasl.mechanisms") or "PLAIN").upper()
    if mechanism not in SASL_MECHANISMS:
        raise SettingsError(f"LOCKSTEP_KAFKA_SASL_MECHANISM={mechanism!r}: Lockstep's three Kafka clients "
                            f"(confluent-kafka, Faust, Spark) share {', '.join(SASL_MECHANISMS)}; use one of them")
    username, password = client.get("sasl.username"), client.get("sasl.password")
    if not username or not password:
        raise SettingsError(f"LOCKSTEP_KAFKA_SECURITY_PROTOCOL={protocol} needs a principal: set "
                            "LOCKSTEP_KAFKA_SASL_USERNAME and LOCKSTEP_KAFKA_SASL_PASSWORD")
    return KafkaSecurity(protocol, mechanism, username, password, security.ca_location)


def _jaas_quoted(value: str | None) -> str:
    """A JAAS option value: in double quotes, with backslash and quote escaped."""
    escaped = (value or "").replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def kafka_passthrough(env: Mapping[str, str]) -> dict[str, str]:
    """``LOCKSTEP_KAFKA_SASL_MECHANISM=PLAIN`` becomes ``{"sasl.mechanism": "PLAIN"}``."""
    return {
        key[len(KAFKA_PASSTHROUGH_PREFIX):].lower().replace("_", "."): value
        for key, value in env.items()
        if key.startswith(KAFKA_PASSTHROUGH_PREFIX)
    }
