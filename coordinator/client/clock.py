"""The one wall clock every process stamps events with (epoch milliseconds)."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Epoch milliseconds now.

    >>> now_ms() > 1_700_000_000_000
    True
    """
    return int(time.time() * 1000)
