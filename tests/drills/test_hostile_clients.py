"""`lockstep serve` and the coordinator under hostile and careless clients, with a pipeline
running: every attack gets its documented answer (docs/security.md, docs/reads.md), while an
honest reader that checks the pipeline's invariant every 0.25 s never fails and never sees it
broken, and the server's memory stays within a bound."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable

import psutil
import psycopg
import pytest
from confluent_kafka import Producer

from coordinator.client.commands import CommandClient, new_request_id
from coordinator.client.state import read_state
from coordinator.client.topics import Topics
from coordinator.domain import AcquireLease, entity_key
from coordinator.settings import Settings
from tests.support import wait_until
from tests.support.clicks import PIPELINE, Clicks
from tests.support.serving import Served

pytestmark = [pytest.mark.integration, pytest.mark.slow]
RUNAWAY = "SELECT count(*) FROM generate_series(1, 100000000000)"
INVARIANT = "SELECT (SELECT COUNT(*) FROM clicks) AS clicks, (SELECT SUM(views) FROM per_page) AS views"
MEMORY_BOUND_MB = 400  # the serve process' resident memory, whatever its clients do


class HonestReader(threading.Thread):
    """Reads both tables at one snapshot every 0.25 s: their counts must agree (every click is in
    per_page's views at every exact point). Records every failure and every broken invariant."""

    def __init__(self, served: Served) -> None:
        super().__init__(name="honest-reader", daemon=True)
        self.served, self.reads, self.problems = served, 0, []  # type: ignore[var-annotated]
        self.stopping = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.served.dsn(), autocommit=True) as conn:
            while not self.stopping.wait(0.25):
                try:
                    clicks, views = conn.execute(INVARIANT).fetchone()  # type: ignore[misc]
                except psycopg.Error as exc:
                    self.problems.append(f"failed: {exc.sqlstate} {exc}")
                    continue
                self.reads += 1
                if clicks != views:
                    self.problems.append(f"broken: {clicks} clicks, {views} views")


def rss_mb(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / (1 << 20)


def sqlstate_of(conn: psycopg.Connection, sql: str) -> str | None:
    try:
        conn.execute(sql).fetchall()
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def raw_query(port: int, sql: str) -> socket.socket:
    """A client that sends a query and then never reads what comes back."""
    sock = socket.create_connection(("127.0.0.1", port))
    params = b"user\x00lockstep\x00database\x00lockstep\x00\x00"
    sock.sendall(struct.pack("!II", 8 + len(params), 196608) + params)
    time.sleep(0.5)
    body = sql.encode() + b"\x00"
    sock.sendall(b"Q" + struct.pack("!I", 4 + len(body)) + body)
    return sock


def message(kind: bytes, *parts: bytes) -> bytes:
    body = b"".join(parts)
    return kind + struct.pack("!I", 4 + len(body)) + body


def replies(sock: socket.socket, until: bytes, count: int = 1) -> tuple[bytes, bytes]:
    """What the server sends until its ``count``-th message of kind ``until``: the kinds in order,
    and the bytes (the server sends nothing more until it is asked again)."""
    data, kinds = b"", b""
    while kinds.count(until) < count:
        chunk = sock.recv(1 << 16)
        assert chunk, f"the server ended the connection after {kinds!r}"
        data += chunk
        kinds, at = b"", 0
        while at + 5 <= len(data) and at + 1 + struct.unpack("!I", data[at + 1:at + 5])[0] <= len(data):
            kinds += data[at:at + 1]
            at += 1 + struct.unpack("!I", data[at + 1:at + 5])[0]
    return kinds, data


def test_hostile_clients_get_their_answers_and_the_honest_reader_never_fails(
    run_pipeline: Callable[..., Settings], make_topic: Callable, kafka_bootstrap: str, coordinator_env: dict[str, str],
    serve: Callable[..., Served],
) -> None:
    coordinator_env["LOCKSTEP_LEASE_PER_HOLDER"] = "20"
    topic = make_topic(partitions=1)
    settings = run_pipeline(PIPELINE.format(topic=topic))
    clicks = Clicks(kafka_bootstrap, topic)
    clicks.settle(settings, 40)
    served = serve(settings, "--max-connections", "8", "--workers", "3")
    honest = HonestReader(served)
    honest.start()
    feeding = threading.Event()
    feeder = threading.Thread(target=lambda: [clicks.send(5) for _ in iter(lambda: feeding.wait(0.3), True)],
                              daemon=True)
    feeder.start()
    wait_until(lambda: honest.reads >= 4, "the honest reader reading", timeout=60)
    baseline = rss_mb(served.process.pid)
    try:
        # runaway queries, more of them than query workers: each stopped at its statement_timeout
        results: list[tuple[str | None, float]] = []

        def runaway() -> None:
            with psycopg.connect(served.dsn(), autocommit=True) as conn:
                conn.execute("SET statement_timeout = '2s'")
                began = time.monotonic()
                results.append((sqlstate_of(conn, RUNAWAY), time.monotonic() - began))

        threads = [threading.Thread(target=runaway) for _ in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert [state for state, _ in results] == ["57014"] * 5 and max(t for _, t in results) < 10, results

        # a cancel (psql's Ctrl-C) stops a runaway query within a second
        with psycopg.connect(served.dsn(), autocommit=True) as conn:
            canceller = threading.Timer(1.0, conn.cancel)
            canceller.start()
            began = time.monotonic()
            assert sqlstate_of(conn, RUNAWAY) == "57014"
            assert time.monotonic() - began < 2.5
            assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection lives on

            # a result past max_result_size: 53200, the server holds a few batches of it at most
            conn.execute("SET max_result_size = '1MB'")
            assert sqlstate_of(conn, "SELECT * FROM generate_series(1, 50000000)") == "53200"
            conn.execute("RESET max_result_size")
            # a statement past 1 MiB: 54000, and the connection still serves
            assert sqlstate_of(conn, "SELECT 1 -- " + "x" * (2 << 20)) == "54000"
            assert conn.execute("SELECT 2").fetchone() == (2,)
            # Lockstep's own tables stay hidden, whatever a CTE is named
            assert sqlstate_of(conn, "SELECT * FROM per_page, __lockstep_t0 WHERE EXISTS "
                                     "(WITH __lockstep_t0 AS (SELECT 1) SELECT 1)") == "42601"

        # a client that never reads a large result: its connection ends at its statement's timeout,
        # and the server held a few batches of it meanwhile
        stalled = raw_query(served.port, "SET statement_timeout = '3s'; SELECT * FROM generate_series(1, 200000000)")
        time.sleep(6)
        assert rss_mb(served.process.pid) < baseline + MEMORY_BOUND_MB / 2
        stalled.settimeout(10)
        while stalled.recv(1 << 20):  # what was on its way, then the end the server made
            pass
        stalled.close()

        # a suspended portal left idle frees its query worker when its statement's time is up (57014 on
        # its next Execute); a Sync outside a transaction block closes the portals (34000)
        idle_portal = raw_query(served.port, "SET statement_timeout = '1s'")
        idle_portal.settimeout(30)
        assert replies(idle_portal, b"Z", count=2)[0].endswith(b"CZ")  # the startup's, then the SET's
        select = b"SELECT * FROM generate_series(1, 1000000)\x00"
        idle_portal.sendall(message(b"P", b"s1\x00", select, b"\x00\x00")
                            + message(b"B", b"p1\x00s1\x00", b"\x00\x00" * 3)
                            + message(b"E", b"p1\x00", struct.pack("!I", 1)) + message(b"H"))
        assert replies(idle_portal, b"s")[0] == b"12Ds"  # ParseComplete, BindComplete, a row, PortalSuspended
        time.sleep(1.5)
        idle_portal.sendall(message(b"E", b"p1\x00", struct.pack("!I", 1)) + message(b"S"))
        kinds, data = replies(idle_portal, b"Z")
        assert kinds == b"EZ" and b"57014" in data, data
        idle_portal.sendall(message(b"B", b"p2\x00s1\x00", b"\x00\x00" * 3)
                            + message(b"E", b"p2\x00", struct.pack("!I", 1)) + message(b"S"))
        assert replies(idle_portal, b"Z")[0] == b"2DsZ"
        idle_portal.sendall(message(b"E", b"p2\x00", struct.pack("!I", 1)) + message(b"S"))
        kinds, data = replies(idle_portal, b"Z")
        assert kinds == b"EZ" and b"34000" in data, data
        idle_portal.close()

        # silent sockets fill the startup slots: a client still gets in (the oldest gives way)
        silent = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(12)]
        with psycopg.connect(served.dsn(), autocommit=True) as conn:
            assert conn.execute("SELECT 3").fetchone() == (3,)
        # and each is dropped by the startup deadline (10 s)
        silent[-1].settimeout(15)
        assert silent[-1].recv(1) == b""
        for sock in silent:
            sock.close()

        # too many clients: the ninth of 8 allowed is turned away with 53300
        held = [psycopg.connect(served.dsn(), autocommit=True) for _ in range(7)]  # + the honest reader
        with pytest.raises(psycopg.OperationalError, match="too many clients already"):
            psycopg.connect(served.dsn())
        for conn in held:
            conn.close()

        def free_slot() -> bool:  # the server sees the clients leave as it reads their Terminate
            try:
                psycopg.connect(served.dsn()).close()
            except psycopg.OperationalError:
                return False
            return True

        wait_until(free_slot, "a free slot again", timeout=10)

        # an idle repeatable-read transaction: the session ends with 25P03, its lease goes at once
        idle = psycopg.connect(served.dsn())
        idle.execute("SET idle_in_transaction_session_timeout = '5s'")
        idle.commit()
        idle.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        idle.execute("SELECT COUNT(*) FROM clicks").fetchone()
        went_idle = time.monotonic()  # the lease is held from the first read on; read before it times out
        wait_until(lambda: read_state(settings).leases, "the transaction's lease", timeout=4)
        time.sleep(max(0.0, went_idle + 5.5 - time.monotonic()))
        with pytest.raises(psycopg.Error) as ended:
            idle.execute("SELECT 1").fetchone()
        assert ended.value.sqlstate == "25P03" and "idle-in-transaction timeout" in str(ended.value)
        wait_until(lambda: not read_state(settings).leases, "the idle transaction's lease released", timeout=5)

        # a forged tombstone of per_page's newest exact point: written back, readers keep reading it
        state = read_state(settings)
        newest = max(state.exact_points("per_page"))
        forger = Producer(settings.kafka_config())
        forger.produce(Topics(settings.topic_prefix).completions,
                       key=entity_key(state.completions["per_page"][newest]).encode(), value=None)
        assert forger.flush(10) == 0
        wait_until(lambda: newest in read_state(settings).completions.get("per_page", {}), "written back", timeout=15)

        # a lease flood: one holder gets 20 leases, then 'holds 20 leases' refusals
        client = CommandClient(settings)
        try:
            outcomes = [client.emit(AcquireLease(new_request_id(), f"flood-{i}", "flooder", ("per_page",), newest,
                                                 60_000, "s")) for i in range(25)]
        finally:
            client.close()
        assert sum(o.accepted for o in outcomes) == 20
        assert all("already holds 20 leases" in o.reason for o in outcomes[20:]), outcomes[20].reason

        after = rss_mb(served.process.pid)
        print(f"serve's resident memory: {baseline:.0f} MB before the attacks, {after:.0f} MB after")
        assert after < baseline + MEMORY_BOUND_MB, (baseline, after)
    finally:
        feeding.set()
        honest.stopping.set()
        honest.join(30)
    assert honest.problems == [] and honest.reads > 50, (honest.reads, honest.problems[:5])
