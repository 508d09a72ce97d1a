"""Where a job's time for one barrier goes, phase by phase, for the barrier's completion.

``lockstep delays`` and ``bench.freshness`` print these phases, so the next person sees
whether a barrier's time went into planning, the Spark write, waiting for the log upkeep
of the barrier before, or looking up the commit.

Example::

    watch = Stopwatch()
    with watch.phase("plan"):
        frame = build_the_dataframe()
    with watch.phase("write"):
        frame.write.format("delta").save(path)
    watch.phases()   # (PhaseTime("plan", 12), PhaseTime("write", 480))
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from coordinator.domain import PhaseTime


class Stopwatch:
    """Milliseconds per named phase; a phase entered twice adds up."""

    def __init__(self) -> None:
        self._ms: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self._ms[name] = self._ms.get(name, 0.0) + (time.perf_counter() - start) * 1000

    def add(self, name: str, ms: float) -> None:
        """A phase measured elsewhere (e.g. Spark's progress of a streaming query's batch)."""
        self._ms[name] = self._ms.get(name, 0.0) + ms

    def entered(self, name: str) -> bool:
        """True if the phase ``name`` ran (or was added) in this barrier.

        >>> watch = Stopwatch()
        >>> watch.add("dead_letters", 5.0)
        >>> watch.entered("dead_letters"), watch.entered("plan")
        (True, False)
        """
        return name in self._ms

    def phases(self) -> tuple[PhaseTime, ...]:
        """The phases in the order they were first entered.

        >>> watch = Stopwatch()
        >>> with watch.phase("plan"):
        ...     pass
        >>> [p.name for p in watch.phases()]
        ['plan']
        """
        return tuple(PhaseTime(name, round(ms)) for name, ms in self._ms.items())
