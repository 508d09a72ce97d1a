"""The source database of the local change-data-capture stack: a PostgreSQL server (Debian's
``postgresql-15``, installed by ``scripts/setup``) on 127.0.0.1 with ``wal_level=logical``, so
Debezium can read its change log. ``lockstep dev up --postgres`` and the CDC tests use this class.

PostgreSQL refuses to run as root, so under root the server runs as the package's own
``postgres`` user, and its data folder must be one that user can reach: ``home/data`` when it
can, else a folder of its own under the ``postgres`` user's home (named after ``home``).

Example::

    pg = LocalPostgres(home=Path(".lockstep/postgres"), port=5432, database="lockstep")
    pg.up()                                    # initdb the first time, start, create the database
    pg.sql("CREATE TABLE t (id int PRIMARY KEY)")
    pg.url                                     # 'postgresql://postgres@127.0.0.1:5432/lockstep'
    pg.down()                                  # a fast shutdown (SIGINT): clients are disconnected
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import signal
import subprocess
from pathlib import Path
from urllib.parse import urlparse

from coordinator.settings import Settings
from lockstep.dev.service import HOST, LocalService, ServiceError

DEFAULT_PORT = 5432
SUPERUSER = "postgres"  # initdb's superuser; local connections from 127.0.0.1 are trusted (loopback only)
SERVER_SETTINGS = {
    "listen_addresses": HOST,
    "unix_socket_directories": "",  # TCP on loopback only: no socket file whose folder root must lend out
    "wal_level": "logical",  # Debezium reads the change log through a logical replication slot
    "max_wal_senders": "10",
    "max_replication_slots": "10",
}


class PostgresError(ServiceError):
    """The local PostgreSQL server could not be started, stopped or asked; the message says why."""


def server_binaries() -> Path:
    """The newest PostgreSQL (15 or later) installed by Debian's packages (15's folder if none is)."""
    found = sorted((int(m.group(1)), p.parent) for p in Path("/usr/lib/postgresql").glob("*/bin/postgres")
                   if (m := re.fullmatch(r"(\d+)", p.parent.parent.name)) and int(m.group(1)) >= 15)
    return found[-1][1] if found else Path("/usr/lib/postgresql/15/bin")


class LocalPostgres(LocalService):
    """Owns one PostgreSQL cluster: its data folder, log and pid file."""

    name = "postgres"
    error = PostgresError
    port_setting = f"LOCKSTEP_POSTGRES_URL=postgresql://{SUPERUSER}@{HOST}:<port>/lockstep"
    stop_signal = signal.SIGINT  # "fast" shutdown; SIGTERM ("smart") would wait for Debezium to hang up

    def __init__(self, home: Path, port: int = DEFAULT_PORT, database: str = "lockstep") -> None:
        super().__init__(home, port)
        self.database = database
        self.bin = server_binaries()
        self.main_class = str(self.bin / "postgres")
        self.as_root = os.geteuid() == 0
        self.data = self._data_folder()

    @classmethod
    def for_settings(cls, settings: Settings) -> LocalPostgres | None:
        """The server ``lockstep dev`` manages: ``$LOCKSTEP_HOME/postgres`` on LOCKSTEP_POSTGRES_URL's
        port and database; None if that URL is not on loopback (a database of its own)."""
        url = urlparse(settings.postgres_url)
        if url.hostname not in (HOST, "localhost") or (url.username or SUPERUSER) != SUPERUSER:
            return None
        return cls(settings.home / "postgres", url.port or DEFAULT_PORT, url.path.strip("/"))

    @property
    def url(self) -> str:
        """The database as ``LOCKSTEP_POSTGRES_URL`` names it (and libpq understands it)."""
        return f"postgresql://{SUPERUSER}@{HOST}:{self.port}/{self.database}"

    @property
    def marker(self) -> str:
        return str(self.data)

    def _data_folder(self) -> Path:
        try:
            account = pwd.getpwnam(SUPERUSER)
        except KeyError:  # PostgreSQL is not installed (yet): prepare() says how to install it
            return self.home / "data"
        if not self.as_root or self._reachable_by(account, self.home):
            return self.home / "data"
        digest = hashlib.sha256(str(self.home).encode()).hexdigest()[:12]
        return Path(account.pw_dir) / "lockstep" / digest / "data"

    @staticmethod
    def _reachable_by(account: pwd.struct_passwd, folder: Path) -> bool:
        """Whether ``account`` may enter ``folder``'s nearest existing ancestor and every folder
        above it (``home`` itself may not exist yet; it is created with mode 755)."""
        for parent in [folder, *folder.parents]:
            try:
                st = parent.stat()
            except FileNotFoundError:
                continue
            if st.st_uid == account.pw_uid:
                allowed = st.st_mode & 0o100
            elif st.st_gid == account.pw_gid:
                allowed = st.st_mode & 0o010
            else:
                allowed = st.st_mode & 0o001
            if not allowed:
                return False
        return True

    def _as_postgres(self, command: list[str]) -> list[str]:
        if not self.as_root:
            return command
        return ["setpriv", f"--reuid={SUPERUSER}", f"--regid={SUPERUSER}", "--init-groups", *command]

    def prepare(self) -> None:
        """``initdb`` the first time (as the ``postgres`` user under root), trusting loopback."""
        if not Path(self.main_class).exists():
            raise PostgresError(f"no PostgreSQL server at {self.main_class}. Run scripts/setup as root (it installs "
                                "Debian's postgresql-15), or apt-get install -y postgresql-15.")
        if (self.data / "PG_VERSION").exists():
            return
        self.data.mkdir(parents=True, exist_ok=True)
        if self.as_root:
            account = pwd.getpwnam(SUPERUSER)
            for folder in [self.data, *self.data.parents]:
                if folder == self.home or folder == Path(account.pw_dir):
                    break
                os.chown(folder, account.pw_uid, account.pw_gid)
        self.data.chmod(0o700)
        done = subprocess.run(self._as_postgres([str(self.bin / "initdb"), "-D", str(self.data), "-U", SUPERUSER,
                                                 "--auth=trust", "-E", "UTF8", "--no-locale"]),
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise PostgresError(f"initdb failed in {self.data}:\n{done.stdout}{done.stderr}")

    def command(self) -> list[str]:
        settings = [arg for name, value in SERVER_SETTINGS.items() for arg in ("-c", f"{name}={value}")]
        return self._as_postgres([self.main_class, "-D", str(self.data), "-p", str(self.port), *settings])

    def answers(self) -> bool:
        done = subprocess.run([str(self.bin / "pg_isready"), "-h", HOST, "-p", str(self.port), "-U", SUPERUSER, "-q"],
                              capture_output=True, text=True, timeout=10)
        self.last_error = f"pg_isready exited {done.returncode}"
        return done.returncode == 0

    def up(self, timeout: float = 60.0) -> int:
        """Start the server unless ours already runs, and create the database if it is missing;
        returns the server's pid."""
        pid = self.start(timeout)
        exists = self.sql(f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'", database="postgres")
        if not exists:
            self.sql(f'CREATE DATABASE "{self.database}"', database="postgres")
        return pid

    def destroy(self) -> None:
        """Stop the server and delete its data folder (tests; ``lockstep dev down`` keeps the data)."""
        self.down()
        shutil.rmtree(self.data.parent if self.data.parent != self.home else self.data, ignore_errors=True)

    def sql(self, statements: str, database: str | None = None) -> str:
        """Run SQL with ``psql`` as the superuser; returns its unaligned output (rows of ``|``-separated
        fields). A failing statement raises ``PostgresError`` with PostgreSQL's message."""
        done = subprocess.run([str(self.bin / "psql"), "-h", HOST, "-p", str(self.port), "-U", SUPERUSER,
                               "-d", database or self.database, "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"],
                              input=statements, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise PostgresError(f"psql on {self.url}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout.strip()
