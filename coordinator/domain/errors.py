"""The error every Lockstep error derives from, with the exit code the ``lockstep`` command ends with.

Code below the CLI raises; the CLI catches ``LockstepError`` once, at its root, prints
``"<label>: <message>"`` and exits with the error's code, so every command keeps the same
promise to scripts. Standard library only, like the rest of the domain.

Example::

    >>> try:
    ...     check_known(["nope"], {"events": 1, "sums": 2})
    ... except LockstepError as exc:
    ...     print(f"{exc.label}: {exc} (exit {exc.exit_code})")
    rejected: unknown table(s): nope; registered: events, sums (exit 1)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from enum import IntEnum
from typing import ClassVar


class ExitCode(IntEnum):
    """What ``lockstep`` exits with; scripts can rely on these."""

    OK = 0
    FAILED = 1  # the operation failed, a command was rejected, a demo read saw anomalies
    USAGE = 2  # a bad flag, LOCKSTEP_* value or pipeline file (2 is click's code for usage errors)
    UNREACHABLE = 3  # the broker or the coordinator does not answer (`dev status`: the broker is stopped)
    NOT_STARTED = 4  # a part Lockstep starts itself (local broker, worker, Spark) could not start
    INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
    TERMINATED = 143  # SIGTERM (kill PID, systemd, Kubernetes), as shells report it: stopped cleanly


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (``kill PID``, systemd, Kubernetes): every command stops the way Ctrl-C
    stops it (a KeyboardInterrupt, so the same cleanup runs) and exits ``TERMINATED``."""


class LockstepError(Exception):
    """An error a person can act on: ``str(exc)`` says what is wrong and how to fix it."""

    exit_code: ClassVar[ExitCode] = ExitCode.FAILED
    label: ClassVar[str] = "error"


class UsageError(LockstepError):
    """A setting, flag or file the user gave cannot be used."""

    exit_code = ExitCode.USAGE


class Unreachable(LockstepError):
    """Something Lockstep talks to does not answer; the message names what and where."""

    exit_code = ExitCode.UNREACHABLE


class NotAuthorised(LockstepError):
    """The broker refused this principal (Kafka ACLs); the message names the principal and the grant it lacks."""

    label = "not authorised"


class NotStarted(LockstepError):
    """A part Lockstep starts itself (broker, worker, Spark) could not start; the message says why."""

    exit_code = ExitCode.NOT_STARTED


class Rejected(LockstepError):
    """A command is invalid against the current state; ``str(exc)`` is the reason for a person."""

    label = "rejected"


class ForeignState(Rejected):
    """A table's folder holds data or streaming state of another table (one of the same name in
    another pipeline, or from before a drop): a job never continues it. The message names both and
    how to fix it."""

    label = "refused"


class UnknownTables(Rejected):
    """Tables that are not registered with the coordinator (checked before any work starts)."""

    def __init__(self, unknown: Iterable[str], registered: Collection[str]) -> None:
        self.unknown = list(unknown)
        super().__init__(f"unknown table(s): {', '.join(self.unknown)}; registered: {', '.join(sorted(registered)) or 'none'}")


def check_known(tables: Iterable[str], registered: Collection[str]) -> None:
    """Raise ``UnknownTables`` naming every table of ``tables`` not in ``registered``."""
    unknown = [t for t in tables if t not in registered]
    if unknown:
        raise UnknownTables(unknown, registered)
