"""Choosing, barrier by barrier, between applying a table's changes and recomputing it.

Applying changes costs what the changed keys touch: little where they are near each other (new
and recent rows), but every file of the table where they are spread over all of it, and then a
MERGE costs more than recomputing the table from its sources (a 10M-row star join, 9 s against
3.8 s at c34c322; docs/performance.md); and a barrier of applied changes pays a fixed cost of its own
(1-3 s here), more than recomputing a small table over small sources takes (Nexmark's q3 over
a million events: 2.6 s against 0.9 s). Neither is known in advance, so the job measures both: the
first barrier is always a recomputation; while the changes' barriers cost more than that, the
next ones recompute, and every ``PROBE_EVERY``-th of them applies the changes again to learn
whether they got cheaper. Both ways give the same table, so only the cost differs. Each
commit keeps what was measured, so a restarted job goes on choosing from it. The first barrier
a process applies changes at is not measured: it pays for compiling the MERGE's code (the JIT,
Spark's generated code), and a cold figure would have the job recompute for ``PROBE_EVERY``
barriers (a first MERGE of 574 groups into 300,000 took 4.55 s, the next ones 3.14 and 2.51 s:
``bench.keyed_writes --groups 300000``, 2026-12-01); the next barrier applies them again, warm. A keyed
aggregate chooses the same way between rewriting its table and MERGE-ing its changed groups
(``maintenance.writes.upsert_groups``). A keyed aggregate in the changelog layout appends its
changed groups and is compacted (rewritten, one row a key) after ``COMPACT_APPENDS`` appends, or
sooner once they hold ``COMPACT_SHARE`` of the table's bytes: its readers skip the older rows of
each key, which costs them what those rows weigh.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_jobs.planning.plan import COMPACT_APPENDS, COMPACT_SHARE

PROBE_EVERY = 10  # while recomputing is cheaper, every 10th barrier tries the changes again
MARGIN = 1.25  # applying must cost this much more than recomputing before recomputing wins (noise)


@dataclass
class CostChoice:
    """What this job measured of both ways, and which one the next barrier takes.

    Example::

        choice = CostChoice()
        choice.measured(whole=True, seconds=3.8)    # the first barrier: recomputed
        choice.measured(whole=False, seconds=20.0)  # the changes applied, cold: not recorded
        choice.measured(whole=False, seconds=9.0)   # applied again, warm
        choice.whole()                              # True: the next barrier recomputes
    """

    whole_s: float | None = None  # the last recomputation
    applied_s: float | None = None  # the last barrier that applied changes
    since_probe: int = 0  # recomputations since changes were last applied
    probe_every: int = PROBE_EVERY  # 1: apply the changes at every barrier, whatever they cost
    compacted_bytes: float | None = None  # a changelog table's size when last compacted (or rebuilt)
    appends: int = 0  # a changelog table's appends since
    warm: bool = False  # this process has applied changes once (not kept: a new process is cold again)

    def whole(self) -> bool:
        """True if the next barrier should recompute the table rather than apply its changes."""
        if self.whole_s is None or self.applied_s is None or self.applied_s <= self.whole_s * MARGIN:
            return False
        return self.since_probe + 1 < self.probe_every

    def state(self) -> dict[str, float]:
        """What was measured, for a commit's metadata (a restarted job goes on from it)."""
        found = {"whole_s": self.whole_s, "applied_s": self.applied_s, "since_probe": float(self.since_probe),
                 "compacted_bytes": self.compacted_bytes,
                 "appends": None if self.compacted_bytes is None else float(self.appends)}  # (changelog tables')
        return {k: v for k, v in found.items() if v is not None}

    def restore(self, state: dict[str, float]) -> None:
        """Go on from ``state`` (``state()`` of an earlier run of the job), if nothing was measured yet."""
        if self.whole_s is None and self.applied_s is None:
            self.whole_s, self.applied_s = state.get("whole_s"), state.get("applied_s")
            self.since_probe = int(state.get("since_probe", 0))
            self.compacted_bytes, self.appends = state.get("compacted_bytes"), int(state.get("appends", 0))

    def measured(self, whole: bool, seconds: float) -> None:
        """Record a barrier's cost, taken the way it went; the process's first applied changes are
        not recorded, nor counted as a probe, so the next barrier applies them again."""
        if whole:
            self.whole_s = seconds
            self.since_probe += 1
        elif not self.warm:
            self.warm = True
        else:
            self.applied_s = seconds
            self.since_probe = 0

    def compact_due(self, table_bytes: int) -> bool:
        """True if a changelog table of ``table_bytes`` should be compacted rather than appended to.

        Example::

            choice = CostChoice(compacted_bytes=100e6, appends=12)
            choice.compact_due(105_000_000)  # False: 12 appends of 5 MB
            choice.compact_due(111_000_000)  # True: the appends hold 11% of it
        """
        return self.compacted_bytes is None or self.appends >= COMPACT_APPENDS \
            or table_bytes - self.compacted_bytes >= COMPACT_SHARE * self.compacted_bytes

    def laid_out(self, compacted: bool, table_bytes: int | None = None) -> None:
        """Record a changelog table's write: compacted (its size after, once known), or appended."""
        if compacted:
            self.appends = 0
            if table_bytes is not None:
                self.compacted_bytes = table_bytes
        else:
            self.appends += 1
