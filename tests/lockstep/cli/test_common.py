"""What the command groups share: stopping at the next step on a signal."""

from __future__ import annotations

import os
import signal

import pytest

from lockstep.cli.common import stop_signals


def test_a_signal_asks_for_a_stop_and_a_second_one_interrupts() -> None:
    with stop_signals() as stopping:
        os.kill(os.getpid(), signal.SIGINT)
        assert stopping.event.is_set()
        with pytest.raises(KeyboardInterrupt):
            stopping.check()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_reclaim_takes_ctrl_c_back_from_a_handler_set_later() -> None:
    """Starting a SparkContext sets a SIGINT handler that cancels every Spark job."""
    cancelled: list[int] = []
    before = signal.getsignal(signal.SIGINT)  # (a SparkContext started by other tests sets its own)
    with stop_signals() as stopping:
        signal.signal(signal.SIGINT, lambda signum, frame: cancelled.append(signum))
        stopping.reclaim()
        os.kill(os.getpid(), signal.SIGINT)
        assert stopping.event.is_set() and not cancelled
    assert signal.getsignal(signal.SIGINT) is before
