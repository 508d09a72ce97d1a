"""A bench's figures as data: ``--json PATH`` writes each figure the bench printed, with its
same-run baseline, the command, the commit, the machine and the time, so a figure quoted in
docs/performance.md can be traced to the run behind it.

Example::

    parser = argparse.ArgumentParser()
    add_json_flag(parser)
    args = parser.parse_args()
    figures = Figures("reads", args)
    figures.add("light read p50", 7.1, "ms", baseline=150.2, samples=[6.9, 7.1, 7.4])
    figures.write()   # nothing unless --json PATH was given
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """``--json PATH`` on a bench's parser; a PATH whose folder is missing is refused before the run."""
    parser.add_argument("--json", type=_json_path, metavar="PATH", default=None,
                        help="also write the figures as JSON to PATH (the command, commit, machine and time with them)")


def _json_path(text: str) -> Path:
    path = Path(text)
    if not path.absolute().parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: the folder {path.absolute().parent} does not exist; create it first")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name such as {path / 'results.json'}")
    return path


@dataclass(frozen=True)
class Figure:
    """One printed figure: ``value`` (a median where there are ``samples``) and the same run's
    ``baseline`` in the same unit; ``ratio`` is baseline / value (above 1: cheaper or faster than
    the baseline where lower is better) unless the bench gives its own."""

    name: str
    value: float
    unit: str
    baseline: float | None = None
    ratio: float | None = None
    samples: tuple[float, ...] = ()
    context: dict[str, Any] = field(default_factory=dict)

    def as_record(self) -> dict[str, Any]:
        record = asdict(self)
        record["samples"] = list(self.samples)
        if self.samples:
            record.update(min=min(self.samples), max=max(self.samples), n=len(self.samples))
        return record


class Figures:
    """The figures of one bench run, written at the end with ``write`` (if ``--json`` was given)."""

    def __init__(self, bench: str, args: argparse.Namespace) -> None:
        self.bench = bench
        self.args = args
        self.started = datetime.datetime.now(datetime.UTC)
        self.figures: list[Figure] = []

    def add(self, name: str, value: float, unit: str, *, baseline: float | None = None, ratio: float | None = None,
            samples: Sequence[float] = (), **context: Any) -> None:
        """Record a figure; ``ratio`` defaults to baseline / value when both are there and non-zero."""
        if ratio is None and baseline and value:
            ratio = baseline / value
        self.figures.append(Figure(name, float(value), unit, baseline, ratio, tuple(float(s) for s in samples), context))

    def add_median(self, name: str, samples: Sequence[float], unit: str, *, baseline: float | None = None,
                   **context: Any) -> None:
        """Record the median of ``samples`` (nothing if there are none)."""
        if samples:
            self.add(name, statistics.median(samples), unit, baseline=baseline, samples=samples, **context)

    def record(self) -> dict[str, Any]:
        return {
            "bench": self.bench,
            "command": " ".join(["python", "-m", f"bench.{self.bench}", *sys.argv[1:]]),
            "args": {k: _plain(v) for k, v in vars(self.args).items()},
            "commit": _commit(),
            "started": self.started.isoformat(timespec="seconds"),
            "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "figures": [f.as_record() for f in self.figures],
        }

    def write(self) -> Path | None:
        """Write the record to ``--json``'s PATH; returns the path, or None without the flag."""
        path: Path | None = getattr(self.args, "json", None)
        if path is None:
            return None
        path.write_text(json.dumps(self.record(), indent=2, default=str) + "\n")
        print(f"figures written to {path}")
        return path


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else str(value)


def _commit() -> str:
    """HEAD's commit, with ``-dirty`` when the work tree has changes (the figure is then not HEAD's)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine() -> dict[str, Any]:
    """What a figure depends on: cores, memory, Python, Java, the OS."""
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr.splitlines()
    except OSError:
        java = []
    try:
        memory_kib = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                              if line.startswith("MemTotal")).split()[1])
    except (OSError, StopIteration, ValueError, IndexError):
        memory_kib = 0
    return {"cores": os.cpu_count(), "memory_gib": round(memory_kib / 2**20, 1), "python": platform.python_version(),
            "java": java[0] if java else "", "os": platform.platform(), "load_1m": round(os.getloadavg()[0], 2)}
