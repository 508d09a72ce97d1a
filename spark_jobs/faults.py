"""Crash points for exactly-once tests and drills.

``LOCKSTEP_CRASH_AT=before_commit:0.3`` makes the job process SIGKILL itself when it reaches
that point, with that probability (default 1). Points: ``before_commit`` (the barrier's Delta
write is about to run) and ``before_completion`` (committed, completion not yet published).
Unset, it costs one environment lookup.
"""

from __future__ import annotations

import os
import random
import signal

POINTS = ("before_commit", "before_completion")


def crash_point(name: str) -> None:
    spec = os.environ.get("LOCKSTEP_CRASH_AT")
    if not spec:
        return
    point, _, chance = spec.partition(":")
    if point not in POINTS:
        raise ValueError(f"LOCKSTEP_CRASH_AT={spec!r}: unknown crash point {point!r}; use one of {', '.join(POINTS)}")
    if point == name and random.random() < float(chance or 1):
        os.kill(os.getpid(), signal.SIGKILL)
