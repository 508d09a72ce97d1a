"""``lockstep serve`` with the real clients: psql, psycopg and the PostgreSQL JDBC driver read
one consistent snapshot per statement, a repeatable-read transaction holds one snapshot and
its lease, bad input is answered with an error and the server goes on serving."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from coordinator.client.state import read_state
from coordinator.settings import Settings
from lockstep.dev.broker import free_port
from lockstep_reads import query
from tests.support import ROOT, wait_until
from tests.support.clicks import Clicks
from tests.support.serving import Served, env_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JDBC = ROOT / ".lockstep" / "jars" / "pgjdbc"


def test_psql_psycopg_and_jdbc_read_consistent_snapshots(clicks_pipeline: tuple[Settings, Clicks],
                                                         serve: Callable[..., Served], tmp_path: Path) -> None:
    """One pipeline for every client and fault (each pipeline costs the suite most of a minute)."""
    settings, clicks = clicks_pipeline
    served = serve(settings)
    clients(settings, clicks, served, tmp_path)
    faults(settings, served, serve)


def clients(settings: Settings, clicks: Clicks, served: Served, tmp_path: Path) -> None:

    # psql: a query, the catalog, a transaction, an error that does not end the session
    shown = served.psql("SELECT page, views FROM per_page ORDER BY page", "\\dt", "\\d per_page",
                        "BEGIN ISOLATION LEVEL REPEATABLE READ", "SELECT SUM(views) AS n FROM per_page",
                        "SHOW transaction_isolation", "COMMIT", "DELETE FROM clicks", "SELECT 1 AS still_here")
    assert " /p0  |    14" in shown.stdout and "public | per_page | table | lockstep" in shown.stdout, shown
    assert " avg_ms | double precision |" in shown.stdout and " repeatable read" in shown.stdout, shown
    assert "ERROR:  DELETE is not allowed" in shown.stderr and "still_here" in shown.stdout, shown

    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        # a statement reads one read-committed snapshot: the same rows as the light API at its barrier
        rows = conn.execute("SELECT page, views, users FROM per_page ORDER BY page").fetchall()
        (barrier,), (versions,) = conn.execute("SHOW lockstep.barrier").fetchone(), \
            conn.execute("SHOW lockstep.versions").fetchone()
        same = query("SELECT page, views, users FROM per_page ORDER BY page", as_of_barrier=int(barrier),
                     settings=settings)
        assert rows == [tuple(r.values()) for r in same.table.to_pylist()]
        assert versions == f'{{"per_page": {same.versions["per_page"]}}}'
        assert conn.execute("SELECT views FROM per_page WHERE page = %s", ["/p1"]).fetchone() == (13,)
        assert conn.execute("SELECT COUNT(*) FROM clicks WHERE ms >= %s AND \"user\" = %s", [7, "u0"]).fetchone() == (5,)
        conn.execute(f"SET lockstep.as_of_barrier = {barrier}")
        assert conn.execute("SELECT page, views, users FROM per_page ORDER BY page").fetchall() == rows
        conn.execute("RESET lockstep.as_of_barrier")
        for sql, sqlstate in (("UPDATE per_page SET views = 0", "25006"), ("SELECT * FROM nope", "42P01"),
                              ("SELEC 1", "42601"), ("SELECT nope FROM per_page", "42703"),
                              ("SET lockstep.nope = 1", "42704"), ("SET lockstep.as_of_barrier = 999999999", None)):
            try:
                conn.execute(sql)
                if sqlstate is not None:
                    pytest.fail(f"{sql} did not fail")
                conn.execute("SELECT * FROM per_page")
                pytest.fail("a read at a barrier that never was did not fail")
            except psycopg.Error as exc:
                assert exc.sqlstate == (sqlstate or "55000"), (sql, exc)
        conn.execute("RESET lockstep.as_of_barrier")

    # repeatable read: the same rows while barriers pass, under a lease held until COMMIT
    with psycopg.connect(served.dsn()) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction():
            first = conn.execute("SELECT page, views FROM per_page ORDER BY page").fetchall()
            (held,) = conn.execute("SHOW lockstep.barrier").fetchone()
            assert any(lease.barrier == int(held) for lease in read_state(settings).leases.values())
            clicks.settle(settings, 30)
            assert conn.execute("SELECT page, views FROM per_page ORDER BY page").fetchall() == first
            assert conn.execute("SELECT COUNT(*) FROM clicks").fetchone() == (40,)  # a table added at the same barrier
            assert conn.execute("SHOW lockstep.barrier").fetchone() == (held,)
        assert not read_state(settings).leases
        assert conn.execute("SELECT COUNT(*) FROM clicks").fetchone() == (70,)  # a new statement, a new snapshot

    # the JDBC driver: what a BI tool asks first, then statements and a transaction
    (tmp_path / "jdbc").mkdir()
    classpath = f"{next(JDBC.glob('postgresql-*.jar'))}:{tmp_path / 'jdbc'}"
    subprocess.run(["javac", "-d", str(tmp_path / "jdbc"), "-cp", classpath,
                    str(ROOT / "tests" / "support" / "jdbc" / "LockstepJdbc.java")], check=True, timeout=120)
    done = subprocess.run(["java", "-cp", classpath, "LockstepJdbc", str(served.port), "per_page"],
                          capture_output=True, text=True, timeout=120)
    steps = {line.split("\t")[0]: line.split("\t")[1:] for line in done.stdout.splitlines()}
    assert steps["product"] == ["OK", "PostgreSQL 15.0 (Lockstep)"], done
    assert steps["tables"][0] == "OK" and "[lockstep,public,per_page,TABLE" in steps["tables"][1], done
    assert steps["columns"][0] == "OK" and ",avg_ms,8,float8," in steps["columns"][1], done
    assert steps["query"] == ["OK", "[/p0,24][/p1,23][/p2,23]"] and steps["types"] == ["OK", "text,int8,float8"], done
    assert steps["prepared"] == ["OK", "[23]"] and steps["prepared_long"] == ["OK", "[3]"], done
    assert steps["unknown_table"][:2] == ["FAIL", "42P01"] and steps["write"][:2] == ["FAIL", "25006"], done
    assert steps["repeatable_read"][0] == "OK", done
    sums, barriers, level = steps["repeatable_read"][1].split(" ")
    assert sums == "[70][70]" and barriers[1:-1].split("][")[0] == barriers[1:-1].split("][")[1] and level == "4", done


def faults(settings: Settings, served: Served, serve: Callable[..., Served]) -> None:
    """100 clients at once, one killed inside a transaction, the coordinator gone."""
    results: list[object] = []

    def client() -> None:
        try:
            with psycopg.connect(served.dsn()) as conn:
                results.append(conn.execute("SELECT SUM(views) FROM per_page").fetchone())
        except psycopg.Error as exc:
            results.append(exc)

    threads = [threading.Thread(target=client) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert results == [(70,)] * 100, [r for r in results if r != (70,)][:3]

    # a client killed inside a repeatable-read transaction: its lease is released
    script = (f"import psycopg, sys, time\nconn = psycopg.connect({served.dsn()!r})\n"
              "conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ\n"
              "conn.execute('SELECT COUNT(*) FROM per_page').fetchone()\nprint('reading', flush=True)\ntime.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "reading"
    wait_until(lambda: read_state(settings).leases, "the transaction's lease", timeout=30)
    holder.kill()
    holder.wait(10)
    wait_until(lambda: not read_state(settings).leases, "the vanished client's lease released", timeout=30)

    # the coordinator gone: a clear error, and the server still answers what needs no coordinator
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        down = Settings(coordinator_url=f"http://127.0.0.1:{free_port()}")
        served_down = serve(settings, env={"LOCKSTEP_COORDINATOR_URL": down.coordinator_url})
        assert "warning: coordinator not reachable" in served_down.log.read_text()
        with psycopg.connect(served_down.dsn(), autocommit=True) as lost:
            with pytest.raises(psycopg.Error) as failed:
                lost.execute("SELECT * FROM per_page")
            assert failed.value.sqlstate == "58000" and "not reachable" in str(failed.value)
            assert lost.execute("SELECT 1 + 1").fetchone() == (2,)
        assert conn.execute("SELECT SUM(views) FROM per_page").fetchone() == (70,)


def test_a_password_is_proved_with_scram_and_bad_setups_are_refused(base_settings: Settings, kafka_bootstrap: str,
                                                                    serve: Callable[..., Served]) -> None:
    settings = Settings.from_env({"LOCKSTEP_BOOTSTRAP": kafka_bootstrap,
                                  "LOCKSTEP_COORDINATOR_URL": f"http://127.0.0.1:{free_port()}"})
    served = serve(settings, "--trust", "none", env={"LOCKSTEP_SERVE_PASSWORD": "s3cret 'pw"})
    assert served.psql("SELECT 40 + 2 AS answer", password="s3cret 'pw").stdout.split()[2] == "42"
    began = time.monotonic()
    wrong = served.psql("SELECT 1", password="nope")
    assert wrong.returncode == 2 and 'password authentication failed for user "lockstep"' in wrong.stderr, wrong
    assert time.monotonic() - began >= 1.0  # a wrong password is answered after a second: no fast guessing
    # a malformed SASL body: refused like a wrong password, without a traceback in the server's log
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        params = b"user\x00lockstep\x00database\x00lockstep\x00\x00"
        sock.sendall(struct.pack("!II", 8 + len(params), 196608) + params)
        assert sock.recv(1) == b"R"
        sock.recv(1 << 16)
        sock.sendall(b"p" + struct.pack("!I", 4 + 20) + b"SCRAM-SHA-256\x00" + b"\xff\xff\xff\x7f\x00\x00")
        answer = b""
        while chunk := sock.recv(1 << 16):
            answer += chunk
    assert answer[:1] == b"E" and b"28P01" in answer, answer
    assert "Traceback" not in served.log.read_text()
    with psycopg.connect(served.dsn(password="s3cret 'pw")) as conn:
        assert conn.execute("SELECT current_user, current_database(), version()").fetchone()[:2] == ("lockstep",
                                                                                                       "lockstep")
    with pytest.raises(psycopg.OperationalError, match='database "other" does not exist'):
        psycopg.connect(served.dsn(password="s3cret 'pw", dbname="other"))

    env = env_of(settings)
    env.pop("LOCKSTEP_SERVE_PASSWORD", None)
    loose = subprocess.run([sys.executable, "-m", "lockstep", "serve", "--host", "0.0.0.0"], capture_output=True,
                           text=True, timeout=60, cwd=ROOT, env=env)
    assert loose.returncode == 2 and "set LOCKSTEP_SERVE_PASSWORD" in loose.stderr, loose
    taken = subprocess.run([sys.executable, "-m", "lockstep", "serve", "--port", str(served.port)],
                           capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert taken.returncode == 4 and f"cannot listen on 127.0.0.1:{served.port}" in taken.stderr, taken
    time.sleep(0.1)
