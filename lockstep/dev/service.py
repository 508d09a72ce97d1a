"""A server of the local development stack: a Java process this checkout starts on 127.0.0.1,
known by the pid file in its home folder, stopped only by that pid.

``LocalBroker`` (Kafka) and ``LocalS3`` (an S3-API server) are ones; each says how it starts
(``command``) and when it answers (``answers``), this class does the rest: refuse a port some
other process holds, start detached with a log, wait until it answers or quote the log, stop
with SIGTERM then SIGKILL, and recognise its own process after a restart of the caller.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

from coordinator.domain.errors import NotStarted
from coordinator.installed import Installed

HOST = "127.0.0.1"


class ServiceError(NotStarted):
    """A local server could not be started or stopped; the message says why and what to do."""


def free_port(exclude: frozenset[int] = frozenset()) -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now and that is not in ``exclude``.

    It is picked below the OS's range of ephemeral ports, the ones outgoing connections get:
    a server started seconds later (a JVM) then finds it still free, which a port the OS
    handed out for a moment (bind to port 0) is not, once a client's connection took it.
    """
    low = _ephemeral_low()
    picker = random.Random()
    for _ in range(1000):
        port = picker.randrange(max(1024, low - 10000), low)
        if port in exclude:
            continue
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        return port
    raise NotStarted(f"no free TCP port on {HOST} between {max(1024, low - 10000)} and {low}")


def _ephemeral_low() -> int:
    """The first port of the OS's ephemeral range (Linux says it; 32768 elsewhere, as Linux's default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


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


def wait_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.1)
    return not process_alive(pid)


class LocalService:
    """One server's lifecycle; subclasses set ``name``, ``main_class``, ``error`` and implement
    ``command``, ``answers`` and (if they need files first) ``prepare``."""

    name = "service"
    main_class = ""
    error: type[ServiceError] = ServiceError
    port_setting = ""  # how a user gives it another port, for the port-in-use error
    stop_signal = signal.SIGTERM  # the signal that asks the server to stop (then SIGKILL after the timeout)

    def __init__(self, home: Path, port: int) -> None:
        self.home = Path(home).absolute()
        self.port = port
        self.last_error = ""  # why the last ``answers`` said no, for the start-up error

    @property
    def pid_file(self) -> Path:
        return self.home / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.home / f"{self.name}.log"

    @property
    def marker(self) -> str:
        """An argument of the command line that tells our process from others of its kind."""
        return str(self.home)

    def command(self) -> list[str]:
        raise NotImplementedError

    def answers(self) -> bool:
        """Whether the server answers a request now (False, not an exception, while it starts;
        ``last_error`` may say why)."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Write what the server needs before it starts (configs, formatted storage)."""

    def start(self, timeout: float) -> int:
        """Start the server unless ours already runs; return its pid once it answers."""
        pid = self.running_pid()
        if pid is not None:
            self.wait_ready(pid, timeout)
            return pid
        pid = self.launch()
        try:
            self.wait_ready(pid, timeout)
        except BaseException:  # not up, for whatever reason (Ctrl-C too): no server left behind
            self.down()
            raise
        return pid

    def launch(self) -> int:
        """Start the server's process without waiting for it to answer (a cluster's nodes answer
        only once enough of them run); returns its pid."""
        if port_in_use(self.port):
            raise self.error(
                f"port {self.port} on {HOST} is already in use by another process, not by a "
                f"Lockstep {self.name} under {self.home}. Stop that process, or pick a free port with "
                f"{self.port_setting or 'another port'}.")
        self.home.mkdir(parents=True, exist_ok=True)
        self.prepare()
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=self.home)
        self.pid_file.write_text(str(proc.pid))
        return proc.pid

    def down(self, timeout: float = 30.0) -> bool:
        """Stop our server by its pid; True if one was running. Never touches other processes."""
        pid = self.running_pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, self.stop_signal)
        if not wait_exit(pid, timeout):
            os.kill(pid, signal.SIGKILL)
            wait_exit(pid, 10.0)
        self.pid_file.unlink(missing_ok=True)
        return True

    def running_pid(self) -> int | None:
        """The pid in our pid file if that process is alive and is our server."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if self.main_class.encode() in cmdline and any(self.marker.encode() in arg for arg in cmdline):
            return pid
        return None

    def wait_ready(self, pid: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not process_alive(pid):
                raise self.error(f"the {self.name} exited during start-up.\n{self.log_tail()}")
            if self.answers():
                return
            time.sleep(0.3)
        why = f" (last error: {self.last_error})" if self.last_error else ""
        raise self.error(f"the {self.name} did not answer on {HOST}:{self.port} within {timeout:.0f}s{why}.\n"
                         f"{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            tail = self.log_file.read_text(errors="replace").splitlines()[-lines:]
        except FileNotFoundError:
            return f"(no log at {self.log_file})"
        return f"last lines of {self.log_file}:\n" + "\n".join(tail)

    def require_jars(self, folder: Path, pattern: str, what: str) -> None:
        """Raise this service's error, saying where it looked and how the jars are found, unless
        ``folder`` holds a jar matching ``pattern``."""
        if not any(folder.glob(pattern)):
            raise self.error(f"no {what} jars in {folder.absolute()}. {Installed.read().where_jars()}")

    def java(self, classpath: Path, heap: str, *args: str) -> list[str]:
        """``java`` with a heap, headless, the jars of ``classpath`` and ``main_class``."""
        return ["java", f"-Xmx{heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true", "-cp", f"{classpath}/*",
                self.main_class, *args]
