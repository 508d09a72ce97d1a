"""The runner's watchdog: a running job whose table does not advance while barriers wait for it
is stuck (a hung Spark action, a micro-batch that never ends, a source that stopped offering
barriers), however alive its process looks. The Supervisor restarts it.

A job is *behind* when a barrier newer than its table's newest exact point is ready for it
(``work.ready_barrier``: announced, for a root job; an exact point of every source, for the
others). It is *stuck* once it has been behind for ``stuck_after_s`` seconds (``LOCKSTEP_STUCK_AFTER_S``)
with no sign of progress: no new exact point of its table, and no Spark work of its query moving
(a new Spark job, or a task finished). A long barrier whose tasks keep finishing is never taken
for stuck. Each restart doubles the bound for that job (60 s, 120 s, 240 s ...), so work that
only the driver does (a long Delta commit) still ends. The bound goes back once no barrier waits
for the job, not at its first commit: a restarted job does more per barrier while it catches up,
and a job whose barriers need the longer bound would otherwise be restarted every other barrier.

Looking at a query's Spark work costs the driver 5-50 ms (Spark scans every job it keeps for the
query's job group), so the watchdog looks once every ``LOOK_EVERY_S`` (a sixth of the bound when
that is shorter) while a job is behind, and once more before it calls the job stuck.

Example::

    watchdog = Watchdog(stuck_after_s=60)
    stuck_for = watchdog.observe("maintain_x", done=10, ready=65, look=lambda: (41, 7), now=time.monotonic())
    if stuck_for is not None:
        ...  # restart the job, then
        watchdog.restarted("maintain_x", now)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

LOOK_EVERY_S = 10.0  # the longest time between two looks at a job's Spark work while it is behind


@dataclass
class _Seen:
    done: int
    activity: Hashable
    since: float  # when the job last showed progress (or stopped being behind)
    looked_at: float  # when its Spark work was last looked at


@dataclass
class Watchdog:
    """Decides, from what a job's table holds and what its query does, whether it is stuck."""

    stuck_after_s: float
    _seen: dict[str, _Seen] = field(default_factory=dict)
    _strikes: dict[str, int] = field(default_factory=dict)  # restarts since the job was last caught up

    def bound(self, job_id: str) -> float:
        """Seconds without progress after which ``job_id`` counts as stuck."""
        return self.stuck_after_s * 2 ** self._strikes.get(job_id, 0)

    def observe(self, job_id: str, done: int, ready: int, look: Callable[[], Hashable], now: float) -> float | None:
        """Record what ``job_id`` holds (``done``: its table's newest exact point) and what is ready
        for it; ``look()`` tells how far its Spark work got (anything that changes while it works),
        called only while the job is behind and a look is due. Return how long it has been stuck,
        or None.

        >>> w = Watchdog(stuck_after_s=60)
        >>> w.observe("j", 10, 12, lambda: (1, 0), now=0.0), w.observe("j", 10, 12, lambda: (1, 0), now=61.0)
        (None, 61.0)
        >>> w.observe("j", 10, 12, lambda: (1, 3), now=62.0), w.observe("j", 11, 12, lambda: (1, 3), now=200.0)
        (None, None)
        """
        seen = self._seen.get(job_id)
        behind = self.stuck_after_s > 0 and ready > done
        if not behind:
            self._strikes.pop(job_id, None)
        if not behind or seen is None:
            self._seen[job_id] = _Seen(done, look() if behind else None, now, now)
            return None
        if done != seen.done:
            self._seen[job_id] = _Seen(done, look(), now, now)
            return None
        bound = self.bound(job_id)
        if now - seen.looked_at >= min(LOOK_EVERY_S, bound / 6) or now - seen.since > bound:
            seen.looked_at = now
            if (activity := look()) != seen.activity:
                seen.activity, seen.since = activity, now
                return None
        stuck_for = now - seen.since
        return stuck_for if stuck_for > bound else None

    def restarted(self, job_id: str, now: float) -> None:
        """``job_id`` was restarted for being stuck: it gets twice the time next."""
        self._strikes[job_id] = self._strikes.get(job_id, 0) + 1
        seen = self._seen.get(job_id)
        if seen is not None:
            seen.since = now

    def forget(self, job_id: str) -> None:
        """``job_id`` stopped here (or failed and waits for its restart): nothing to watch."""
        self._seen.pop(job_id, None)
