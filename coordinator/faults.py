"""Fault points for drills and fault tests.

``LOCKSTEP_CRASH_AT=before_commit:0.3`` (``Settings.crash_at``) makes a process stop itself
when it reaches that point, with that probability (default 1). A job SIGKILLs itself at
``before_commit`` (the barrier's Delta write is about to run), ``before_completion``
(committed, completion not yet published) or, for a keyed table or a table reading a
changelog table, ``after_state_commit`` (its streaming query committed the barrier's state, the
table's commit has not run). The
coordinator's leader SIGSTOPs itself at ``pause_before_announce`` (a barrier planned, not yet
written), once: a paused leader, as a long GC or a frozen VM would pause it, for the fencing
test to resume with SIGCONT. A job reaching ``hang_before_commit`` runs a Spark action that
never ends (``fires_once``, once per process): a hung Spark action, for the watchdog's test.
Unset, a point costs one comparison.
"""

from __future__ import annotations

import os
import random
import signal

from coordinator.settings import CrashAt

_paused: set[str] = set()  # pause and hang points fire once per process


def fires_once(name: str, crash_at: CrashAt | None) -> bool:
    """Whether the drill asks for ``name`` here and it has not fired in this process yet (the
    caller then makes the fault happen)."""
    if crash_at is None or crash_at.point != name or name in _paused or random.random() >= crash_at.chance:
        return False
    _paused.add(name)
    return True


def crash_point(name: str, crash_at: CrashAt | None) -> None:
    """Stop this process at ``name`` if the drill asks for it (and the dice agree)."""
    if crash_at is None or crash_at.point != name or random.random() >= crash_at.chance:
        return
    if name.startswith("pause_"):
        if name not in _paused:
            _paused.add(name)
            os.kill(os.getpid(), signal.SIGSTOP)
        return
    os.kill(os.getpid(), signal.SIGKILL)
