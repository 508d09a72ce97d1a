"""The stop signal a process received, noted before its exception is raised."""

from __future__ import annotations

import signal

import pytest

from coordinator.domain.errors import Terminated
from lockstep import signals


def test_each_handler_notes_its_signal_before_raising_and_the_first_one_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signals, "_received", [])
    previous = signal.getsignal(signal.SIGTERM)
    assert signals.stopped_by() is None
    with pytest.raises(KeyboardInterrupt):
        signals._interrupt(signal.SIGINT, None)
    try:
        with pytest.raises(Terminated):
            signals._terminate(signal.SIGTERM, None)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # a second SIGTERM lets the cleanup finish
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert signals.stopped_by() == signal.SIGINT
