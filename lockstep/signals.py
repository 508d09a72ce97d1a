"""Which stop signal reached this process, so that an error a signal turned into another still
stops the command as that signal asked.

Python raises a signal's exception (``KeyboardInterrupt``, ``Terminated``) wherever the main
thread runs, also inside a C extension's callback. confluent-kafka can lose it there: a Ctrl-C
that lands in a delivery callback during ``Producer.flush`` comes out as "SystemError: ...
returned NULL without setting an exception". So the handlers note the signal first.

Example::

    install()
    try:
        work()
    except (KeyboardInterrupt, Terminated, SystemError) as exc:
        if stopped_as(exc) is None:
            raise
        ...  # stop as Ctrl-C or SIGTERM asked
"""

from __future__ import annotations

import signal
from types import FrameType

from coordinator.domain.errors import Terminated

_received: list[int] = []


def install() -> None:
    """Ctrl-C raises ``KeyboardInterrupt`` as Python's own handler does; the first SIGTERM raises
    ``Terminated`` and later ones are ignored, so a stop's cleanup is not cut short (SIGKILL still
    ends it). Both note the signal."""
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _interrupt)


def stopped_by() -> int | None:
    """The first stop signal this process received (``signal.SIGINT`` or ``SIGTERM``), or None."""
    return _received[0] if _received else None


def stopped_as(exc: BaseException) -> int | None:
    """The stop signal ``exc`` stands for: SIGINT for ``KeyboardInterrupt``, SIGTERM for
    ``Terminated``, the first noted signal for a ``SystemError`` raised after one; else None."""
    if isinstance(exc, Terminated):  # (a KeyboardInterrupt too, so that nothing catches it by accident)
        return signal.SIGTERM
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGINT
    return stopped_by() if isinstance(exc, SystemError) else None


def noted(signum: int) -> None:
    """Note a stop signal a handler of a command's own received."""
    _received.append(signum)


def _terminate(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    noted(signum)
    raise Terminated()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    noted(signum)
    raise KeyboardInterrupt
