"""What many tests share: the checkout's root, waiting for a condition, running the CLI.

Fixture plugins live beside this module (``workers``, ``states``, ``pipelines``; loaded by
``tests/conftest.py``), and so do the helpers of pipeline tests and drills.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, TypeVar

from lockstep.dev.service import ServiceError, free_port, port_in_use

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


class _Server(Protocol):
    def up(self) -> object: ...


S = TypeVar("S", bound=_Server)


def up_on_a_free_port(make: Callable[[int], S], attempts: int = 3) -> S:
    """``make(port)`` started with ``up()`` on a free port. The machine is shared: another process
    may take the port between its pick and the server's start, so a start that failed while some
    other process holds the port tries another one.

    Example::

        registry = up_on_a_free_port(lambda port: LocalRegistry(home, jars, port))
    """
    for attempt in range(1, attempts + 1):
        port = free_port()
        server = make(port)
        try:
            server.up()
        except ServiceError:
            if attempt < attempts and port_in_use(port):
                continue
            raise
        return server
    raise AssertionError("unreachable: the last attempt returns or raises")


def wait_until(condition: Callable[[], T], what: str | Callable[[], str], timeout: float = 90.0) -> T:
    """Poll ``condition`` every 0.2 s until it returns something truthy, and return that. ``what``
    names the condition in the failure; a callable says it as things stand at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what() if callable(what) else what}")
        time.sleep(0.2)


def run_lockstep(*args: str, env: Mapping[str, str], timeout: float = 120.0,
                 cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``lockstep ARGS`` (as ``python -m lockstep``) in ``cwd`` (the checkout's root); output captured as text."""
    return subprocess.run([sys.executable, "-m", "lockstep", *args], env=dict(env), capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def lockstep_in_process(*args: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``lockstep ARGS`` in this process (click's runner), as ``run_lockstep`` returns it: a
    command that needs Spark then uses the test session's instead of starting a JVM of its own
    (20 s and more on this machine). An unexpected exception's traceback goes to stderr."""
    import traceback

    from click.testing import CliRunner

    from lockstep.cli import cli

    result = CliRunner().invoke(cli, list(args), env=dict(env), prog_name="lockstep")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["lockstep", *args], result.exit_code, result.stdout, stderr)


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A Prometheus text exposition parsed: (sample name, sorted labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}
