"""Crash points for exactly-once tests and drills.

``LOCKSTEP_CRASH_AT=before_commit:0.3`` (``Settings.crash_at``) makes the job process SIGKILL
itself when it reaches that point, with that probability (default 1). Points:
``before_commit`` (the barrier's Delta write is about to run) and ``before_completion``
(committed, completion not yet published). Unset, it costs one comparison.
"""

from __future__ import annotations

import os
import random
import signal

from coordinator.settings import CrashAt


def crash_point(name: str, crash_at: CrashAt | None) -> None:
    """SIGKILL this process if the drill asks for a crash at ``name`` (and the dice agree)."""
    if crash_at is not None and crash_at.point == name and random.random() < crash_at.chance:
        os.kill(os.getpid(), signal.SIGKILL)
