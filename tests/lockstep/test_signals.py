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


def test_an_exception_stands_for_the_signal_that_raised_it_and_a_system_error_only_after_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(signals, "_received", [])
    assert signals.stopped_as(KeyboardInterrupt()) == signal.SIGINT
    assert signals.stopped_as(Terminated()) == signal.SIGTERM
    assert signals.stopped_as(SystemError("returned NULL")) is None  # no signal came: a real error
    assert signals.stopped_as(ValueError()) is None
    signals.noted(signal.SIGTERM)
    assert signals.stopped_as(SystemError("returned NULL")) == signal.SIGTERM
    assert signals.stopped_as(ValueError()) is None  # only SystemError is taken for a lost signal
