"""``lockstep dev`` (the local broker and S3 server) and ``lockstep worker`` (the coordinator)."""

from __future__ import annotations

import sys
from dataclasses import asdict, replace

import click
from rich.console import Console
from rich.table import Table

from coordinator.client.acls import ROLES, grant, grants
from coordinator.client.topics import Topics
from coordinator.domain.errors import ExitCode, UsageError
from coordinator.settings import Settings
from lockstep.cli.common import echo_json, format_option
from lockstep.dev.broker import BrokerStatus, LocalBroker, LocalKafkaCluster
from lockstep.dev.connect import LocalConnect
from lockstep.dev.metastore import LocalMetastore
from lockstep.dev.postgres import LocalPostgres
from lockstep.dev.registry import LocalRegistry
from lockstep.dev.s3 import LocalS3
from lockstep.dev.spark import LocalSparkCluster


def local_broker(settings: Settings) -> LocalBroker:
    """The broker ``lockstep dev`` manages: ``$LOCKSTEP_HOME/kafka`` on ``LOCKSTEP_BOOTSTRAP``'s port."""
    broker = LocalBroker.for_settings(settings)
    if broker is None:
        raise UsageError(f"LOCKSTEP_BOOTSTRAP={settings.bootstrap} is not on 127.0.0.1; the local broker only "
                         "runs on loopback. Unset it or use 127.0.0.1:<port>.")
    return broker


def local_metastore(settings: Settings) -> LocalMetastore:
    """The metastore database ``lockstep dev`` manages: ``$LOCKSTEP_HOME/metastore``."""
    meta = LocalMetastore.for_settings(settings)
    if meta is None:
        raise UsageError(f"LOCKSTEP_METASTORE={settings.metastore} is not a Derby database on 127.0.0.1; the local "
                         "metastore only runs on loopback. Unset it or use jdbc:derby://127.0.0.1:<port>/metastore.")
    return meta


def local_cdc(settings: Settings, postgres: bool, registry: bool, connect: bool
              ) -> tuple[LocalPostgres | None, LocalRegistry | None, LocalConnect | None]:
    """The change-data-capture servers asked for (Connect needs the registry), or a usage error
    naming the variable that puts one off loopback."""
    pg = reg = worker = None
    if postgres and (pg := LocalPostgres.for_settings(settings)) is None:
        raise UsageError(f"LOCKSTEP_POSTGRES_URL={settings.postgres_url} is not postgres@127.0.0.1; the local "
                         "PostgreSQL only runs on loopback for its superuser. Unset it or use "
                         "postgresql://postgres@127.0.0.1:<port>/<database>.")
    if (registry or connect) and (reg := LocalRegistry.for_settings(settings)) is None:
        raise UsageError(f"LOCKSTEP_SCHEMA_REGISTRY_URL={settings.schema_registry_url} is not on 127.0.0.1; the "
                         "local registry (which the local Connect writes to) only runs on loopback. Unset it or use "
                         "http://127.0.0.1:<port>/apis/ccompat/v7.")
    if connect and reg is not None and (worker := LocalConnect.for_settings(settings, reg)) is None:
        raise UsageError(f"LOCKSTEP_CONNECT_URL={settings.connect_url} is not on 127.0.0.1; the local Kafka Connect "
                         "only runs on loopback. Unset it or use http://127.0.0.1:<port>.")
    return pg, reg, worker


def start(server: LocalS3 | LocalMetastore | LocalPostgres | LocalRegistry | LocalConnect, timeout: float) -> str:
    """Start a server of the stack unless ours runs; say which it was."""
    already = server.running_pid() is not None
    server.up(timeout=timeout)
    return "already running" if already else "started"


def describe(status: BrokerStatus) -> str:
    if not status.running:
        return f"broker: stopped (bootstrap {status.bootstrap})"
    topics = "not answering" if status.topics is None else f"{status.topics} topics"
    return f"broker: running, pid {status.pid}, bootstrap {status.bootstrap}, {topics}"


@click.group()
def dev() -> None:
    """Run the local development stack: a real single-node KRaft Kafka broker on 127.0.0.1 and,
    with --s3, an S3-API server (s3proxy) for an s3a:// warehouse; with --metastore, a Hive
    metastore database (Derby's network server) that names the tables; with --postgres,
    --registry and --connect, a change-data-capture source (PostgreSQL, a schema registry,
    Kafka Connect with Debezium)."""


@dev.command()
@click.option("--s3", "with_s3", is_flag=True,
              help="Also start the S3-API server (LOCKSTEP_S3_ENDPOINT, default http://127.0.0.1:9000) with the "
                   "bucket of an s3a:// LOCKSTEP_WAREHOUSE; prints the variables that point Lockstep at it.")
@click.option("--brokers", type=click.IntRange(1, 9), default=1, show_default=True,
              help="Run a KRaft cluster of this many nodes (each broker and controller) on the ports "
                   "LOCKSTEP_BOOTSTRAP lists, or on its port and the next ones.")
@click.option("--spark-workers", type=click.IntRange(0, 8), default=0, show_default=True,
              help="Also run a Spark standalone master (LOCKSTEP_SPARK_MASTER's port, default 7077) and this many "
                   "workers of one core each, from the pyspark wheel; `lockstep run --master` uses it.")
@click.option("--metastore", "with_metastore", is_flag=True,
              help="Also start the Hive metastore's database (Derby's network server on the port of a "
                   "jdbc:derby://127.0.0.1:PORT/... LOCKSTEP_METASTORE, default 1527); prints the LOCKSTEP_METASTORE "
                   "that makes every Lockstep table readable by name.")
@click.option("--postgres", "with_postgres", is_flag=True,
              help="Also start PostgreSQL with logical decoding on (LOCKSTEP_POSTGRES_URL's port and database, "
                   "default postgresql://postgres@127.0.0.1:5432/lockstep), a source for Debezium.")
@click.option("--registry", "with_registry", is_flag=True,
              help="Also start a schema registry (Apicurio, in memory) whose Confluent-compatible API is "
                   "LOCKSTEP_SCHEMA_REGISTRY_URL (default http://127.0.0.1:8081/apis/ccompat/v7).")
@click.option("--connect", "with_connect", is_flag=True,
              help="Also start Kafka Connect (standalone, REST on LOCKSTEP_CONNECT_URL, default "
                   "http://127.0.0.1:8083) with Debezium's PostgreSQL connector, writing Avro through the "
                   "registry (implies --registry). Add connectors with POST /connectors.")
@click.option("--timeout", default=90.0, show_default=True, help="Seconds to wait for each server to answer.")
@click.pass_obj
def up(settings: Settings, with_s3: bool, brokers: int, spark_workers: int, with_metastore: bool,
       with_postgres: bool, with_registry: bool, with_connect: bool, timeout: float) -> None:
    """Start the local broker (formats storage the first time); harmless if it already runs.

    Exit 4 if a server could not start (the message quotes its log)."""
    meta = local_metastore(settings) if with_metastore else None  # a usage error before anything starts
    pg, registry, connect = local_cdc(settings, with_postgres, with_registry, with_connect)
    if brokers == 1:
        broker = local_broker(settings)
        already = broker.running_pid() is not None
        status = broker.up(timeout=timeout)
        click.echo(("already running; " if already else "started; ") + describe(status))
    else:
        cluster = LocalKafkaCluster.for_settings(settings, brokers)
        if cluster is None:
            raise UsageError(f"LOCKSTEP_BOOTSTRAP={settings.bootstrap} is not on 127.0.0.1; local brokers only run "
                             "on loopback. Unset it or use 127.0.0.1:<port>.")
        for node, state in zip(cluster.node_ids, cluster.up(timeout=timeout), strict=True):
            click.echo(f"node {node}: " + describe(state))
        click.echo(f"  LOCKSTEP_BOOTSTRAP={cluster.bootstrap} LOCKSTEP_REPLICATION_FACTOR={min(3, brokers)}")
    if with_s3:
        s3 = LocalS3.for_settings(settings)
        if s3 is None:
            raise UsageError(f"LOCKSTEP_S3_ENDPOINT={settings.s3.endpoint} is not on 127.0.0.1; the local S3 server "
                             "only runs on loopback. Unset it or use http://127.0.0.1:<port>.")
        click.echo(f"{start(s3, timeout)}; s3: pid {s3.running_pid()}, endpoint {s3.endpoint}, "
                   f"buckets {', '.join(s3.buckets)} (objects under {s3.home / 'data'})")
        click.echo("  " + " ".join(f"{k}={v}" for k, v in s3.env().items()))
    if meta is not None:
        click.echo(f"{start(meta, timeout)}; metastore: pid {meta.running_pid()}, database {meta.url} (under {meta.home})")
        click.echo(f"  LOCKSTEP_METASTORE={meta.url}")
    if pg is not None:
        click.echo(f"{start(pg, timeout)}; postgres: pid {pg.running_pid()}, database {pg.url} (data in {pg.data})")
        click.echo(f"  LOCKSTEP_POSTGRES_URL={pg.url}")
    if registry is not None:
        click.echo(f"{start(registry, timeout)}; registry: pid {registry.running_pid()}, {registry.url}")
        click.echo(f"  LOCKSTEP_SCHEMA_REGISTRY_URL={registry.url}")
    if connect is not None:
        click.echo(f"{start(connect, timeout)}; connect: pid {connect.running_pid()}, REST {connect.url} "
                   f"(add connectors: POST {connect.url}/connectors)")
        click.echo(f"  LOCKSTEP_CONNECT_URL={connect.url}")
    if spark_workers:
        spark = LocalSparkCluster.for_settings(settings, spark_workers)
        spark.up(timeout=max(timeout, 120.0))
        click.echo(f"started; spark: master {spark.master_url} (web UI http://127.0.0.1:{spark.master.web_port}), "
                   f"{spark_workers} worker(s) of {spark.cores} core(s) and {spark.memory}")
        click.echo(f"  lockstep run PIPELINE --master {spark.master_url}")


@dev.command()
@click.pass_obj
def down(settings: Settings) -> None:
    """Stop the local broker, S3 server, metastore, change-data-capture servers and Spark cluster
    this checkout started (by their pids) and wait for them to exit."""
    registry = LocalRegistry.for_settings(settings)
    connect = LocalConnect.for_settings(settings, registry) if registry is not None else None
    if connect is not None and connect.down():  # before the broker it writes to
        click.echo("connect stopped")
    if registry is not None and registry.down():
        click.echo("registry stopped")
    pg = LocalPostgres.for_settings(settings)
    if pg is not None and pg.down():
        click.echo("postgres stopped")
    broker = local_broker(settings)
    click.echo("broker stopped" if broker.down() else "broker was not running")
    cluster = LocalKafkaCluster.for_settings(settings)
    if cluster is not None and cluster.down():
        click.echo(f"cluster of {len(cluster.ports)} brokers stopped")
    spark = LocalSparkCluster.for_settings(settings)
    if spark is not None and spark.down():
        click.echo("spark master and workers stopped")
    s3 = LocalS3.for_settings(settings)
    if s3 is not None and s3.down():
        click.echo("s3 stopped")
    meta = LocalMetastore.for_settings(settings)
    if meta is not None and meta.down():
        click.echo("metastore stopped")


@dev.command()
@format_option()
@click.pass_context
def status(ctx: click.Context, fmt: str) -> None:
    """Say whether the local broker runs: pid, bootstrap address, topic count (and the S3 server,
    if it runs). Exit 3 if the broker is stopped."""
    state = local_broker(ctx.obj).status()
    s3 = LocalS3.for_settings(ctx.obj)
    s3_pid = s3.running_pid() if s3 is not None else None
    meta = LocalMetastore.for_settings(ctx.obj)
    meta_pid = meta.running_pid() if meta is not None else None
    servers: dict[str, tuple[int, dict[str, str]]] = {}  # the other servers that run: pid, addresses
    registry = LocalRegistry.for_settings(ctx.obj)
    for name, server, addresses in [
        ("postgres", pg := LocalPostgres.for_settings(ctx.obj), {"url": pg.url} if pg else {}),
        ("registry", registry, {"url": registry.url} if registry else {}),
        ("connect", connect := LocalConnect.for_settings(ctx.obj, registry) if registry else None,
         {"url": connect.url} if connect else {}),
    ]:
        if server is not None and (pid := server.running_pid()) is not None:
            servers[name] = (pid, addresses)
    if fmt == "json":
        echo_json({"broker": asdict(state),
                   "s3": {"pid": s3_pid, "endpoint": s3.endpoint} if s3 is not None and s3_pid is not None else None,
                   "metastore": {"pid": meta_pid, "database": meta.url} if meta is not None and meta_pid is not None else None,
                   **{name: {"pid": pid, **addresses} for name, (pid, addresses) in servers.items()}})
    else:
        click.echo(describe(state))
        if s3 is not None and s3_pid is not None:
            click.echo(f"s3: running, pid {s3_pid}, endpoint {s3.endpoint}")
        if meta is not None and meta_pid is not None:
            click.echo(f"metastore: running, pid {meta_pid}, database {meta.url}")
        for name, (pid, addresses) in servers.items():
            click.echo(f"{name}: running, pid {pid}, " + ", ".join(f"{k} {v}" for k, v in addresses.items()))
    if not state.running:
        ctx.exit(ExitCode.UNREACHABLE)


@click.command()
@click.option("--web-port", type=int, help="Port of the REST API (default: from LOCKSTEP_COORDINATOR_URL, 6066).")
@click.option("--loglevel", default="info", show_default=True, type=click.Choice(["debug", "info", "warn", "error", "crit"]),
              help="How much the worker logs.")
@click.pass_obj
def worker(settings: Settings, web_port: int | None, loglevel: str) -> None:
    """Run the coordinator (a Faust worker): decides commands, announces barriers on the leader,
    serves the REST API. Run two for failover (give the second its own --web-port)."""
    from coordinator.stream.app import create_app

    if web_port is not None:
        settings = replace(settings, coordinator_url=f"http://127.0.0.1:{web_port}")
    app = create_app(settings)
    sys.argv = ["lockstep-worker", "worker", "--loglevel", loglevel,
                "--web-host", settings.coordinator_host, "--web-port", str(settings.coordinator_port)]
    app.main()


@click.command()
@click.argument("role", type=click.Choice(ROLES))
@click.argument("principal")
@click.option("--data-topic", "data_topics", multiple=True, metavar="TOPIC",
              help="A topic root tables read (repeat); the coordinator describes it, jobs read it.")
@click.option("--apply", is_flag=True, help="Create the ACLs now, as LOCKSTEP_KAFKA_*'s principal (an admin).")
@format_option()
@click.pass_obj
def acls(settings: Settings, role: str, principal: str, data_topics: tuple[str, ...], apply: bool, fmt: str) -> None:
    """The Kafka ACLs a PRINCIPAL (User:<name>) of ROLE needs under LOCKSTEP_TOPIC_PREFIX
    (docs/security.md); only --apply talks to Kafka.

    \b
    lockstep acls coordinator User:lockstep-coordinator --data-topic shopping_source
    lockstep acls job User:etl --data-topic shopping_source --apply
    """
    if not principal.startswith("User:"):
        raise UsageError(f"PRINCIPAL {principal!r} must look like User:<name>, as the broker names principals")
    if apply:
        settings.check_kafka()  # before printing anything: the root left Kafka's settings unchecked
    rows = [{"resource": g.resource.name.lower(), "pattern": "prefixed" if g.prefixed else "literal", "name": g.name,
             "operations": [op.name.lower() for op in g.operations]}
            for g in grants(role, Topics(settings.topic_prefix), data_topics)]
    if fmt == "json":
        echo_json({"role": role, "principal": principal, "acls": rows})
    else:
        table = Table("resource", "pattern", "name", "operations", title=f"{role} {principal}")
        for row in rows:
            table.add_row(row["resource"], row["pattern"], row["name"], ", ".join(row["operations"]))
        Console().print(table)
    if apply:
        created = grant(settings, principal, role, data_topics)
        click.echo(f"created {len(created)} ACL bindings for {principal}")
