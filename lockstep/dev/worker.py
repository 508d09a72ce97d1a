"""A coordinator worker (``lockstep worker``) run as a child process, started and stopped by pid.

``lockstep demo`` starts one when nothing answers at LOCKSTEP_COORDINATOR_URL, and the test
fixtures start theirs the same way.

Example::

    worker = WorkerProcess(dict(os.environ), port=6066, log=Path(".lockstep/logs/worker.log"))
    worker.start()     # returns once /health says ok
    worker.stop()      # SIGTERM, wait, SIGKILL if needed
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from coordinator.client.rest import get_json
from coordinator.domain.errors import NotStarted, Unreachable
from coordinator.settings import Settings


class WorkerError(NotStarted):
    """The worker did not become healthy; the message holds the tail of its log."""


def healthy(url: str) -> bool:
    """True if a coordinator answers at ``url`` and has folded its state."""
    try:
        return bool(get_json(Settings(coordinator_url=url), "/health", timeout=5).get("status") == "ok")
    except Unreachable:
        return False


@dataclass
class WorkerProcess:
    """One ``lockstep worker`` child process with its REST API on 127.0.0.1:``port``."""

    env: dict[str, str]
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    cwd: Path | None = None  # where it runs (None: the current folder)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> WorkerProcess:
        """Start the process and return at once (``start`` also waits until it is healthy)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lockstep", "worker", "--web-port", str(self.port)],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=self.cwd,
            )
        return self

    def start(self, timeout: float = 90.0) -> WorkerProcess:
        self.launch()
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise WorkerError(f"the coordinator worker exited with {self.proc.returncode}; its log "
                                  f"{self.log} ends with:\n{self._tail()}")
            if healthy(self.url):  # not yet: not listening, or 503 while it folds its state
                return self
            time.sleep(0.3)
        self.stop()
        raise WorkerError(f"the coordinator worker was not healthy within {timeout:.0f}s; its log {self.log} "
                          f"ends with:\n{self._tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def _tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"
