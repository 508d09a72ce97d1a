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
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


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


def run_lockstep(*args: str, env: Mapping[str, str], timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run ``lockstep ARGS`` (as ``python -m lockstep``) from the checkout's root; output captured as text."""
    return subprocess.run([sys.executable, "-m", "lockstep", *args], env=dict(env), capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


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
