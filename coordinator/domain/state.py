"""MetaState: the latest value of every entity, and the views derived from it.

The state stores facts exactly as they arrived (latest per entity key) and nothing else;
everything a reader asks — which completions count, exact points, the topology — is
derived on demand. That is what makes the fold order-independent across topics: no fact's
meaning depends on which topic's record came first.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter

from coordinator.domain.events import (
    END_STATUSES,
    BarrierAnnounced,
    BarrierCompleted,
    JobState,
    JobStatus,
    LeaseState,
    TableState,
    WriterTerm,
)
from coordinator.domain.records import to_record

_COMMITTED_AT = attrgetter("committed_at_ms")


@dataclass
class MetaState:
    """Everything the coordinator knows. Build it with ``fold``; read it through the methods."""

    tables: dict[str, TableState] = field(default_factory=dict)
    jobs: dict[str, JobState] = field(default_factory=dict)
    barriers: dict[int, BarrierAnnounced] = field(default_factory=dict)
    completions: dict[str, dict[int, BarrierCompleted]] = field(default_factory=dict)
    leases: dict[str, LeaseState] = field(default_factory=dict)
    changes: ChangeLog = field(default_factory=lambda: ChangeLog(), compare=False, repr=False)

    def copy(self) -> MetaState:
        return MetaState(
            dict(self.tables),
            dict(self.jobs),
            dict(self.barriers),
            {t: dict(c) for t, c in self.completions.items()},
            dict(self.leases),
        )

    # -- canonical dump ------------------------------------------------------------------

    def canonical(self, *, digests: bool = True) -> dict[str, object]:
        """A JSON-ready dump with sorted keys; equal states give byte-identical dumps.
        ``digests=False``: without the leases' secret digests (what ``/state`` shows)."""
        leases = {k: to_record(v) for k, v in sorted(self.leases.items())}
        if not digests:
            leases = {k: {f: v for f, v in lease.items() if f != "secret_digest"} for k, lease in leases.items()}
        return {
            "tables": {k: to_record(v) for k, v in sorted(self.tables.items())},
            "jobs": {k: to_record(v) for k, v in sorted(self.jobs.items())},
            "barriers": {str(k): to_record(v) for k, v in sorted(self.barriers.items())},
            "completions": {
                f"{t}@{b}": to_record(c)
                for t, by_b in sorted(self.completions.items())
                for b, c in sorted(by_b.items())
            },
            "leases": leases,
        }

    def canonical_json(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))

    def state_hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def records(self) -> int:
        """How many compacted records the state topics hold for this state (pruning bounds it)."""
        return (len(self.tables) + len(self.jobs) + len(self.barriers) + len(self.leases)
                + sum(len(by_b) for by_b in self.completions.values()))

    # -- catalog and topology ------------------------------------------------------------------

    def created(self, table: str) -> bool:
        """Whether ``table`` is in the catalog: declared and, if a CTAS made it, holding its first
        committed barrier. A CTAS table before that is invisible to readers and listings."""
        t = self.tables.get(table)
        return t is not None and (not t.ctas or table in self.completions)

    def catalog(self) -> list[str]:
        """Names of the tables readers can see, sorted."""
        return sorted(t for t in self.tables if self.created(t))

    def pending(self) -> list[str]:
        """CTAS tables whose first barrier is not committed yet, sorted."""
        return sorted(t for t in self.tables if not self.created(t))

    def active_jobs(self) -> Iterator[JobState]:
        return (j for j in self.jobs.values() if j.status not in END_STATUSES)

    def writer_of(self, table: str) -> JobState | None:
        """The active job that writes ``table``, derived from jobs (not from TableState.writer)."""
        return next((j for j in self.active_jobs() if j.sink == table), None)

    def edges(self) -> list[tuple[str, str]]:
        """(source table, sink table) for every active job, sorted."""
        return sorted({(s, j.sink) for j in self.active_jobs() for s in j.sources})

    def downstream(self, table: str) -> list[str]:
        """``table`` and every table that (transitively) reads it, in topological order."""
        readers: dict[str, set[str]] = {}
        for source, sink in self.edges():
            readers.setdefault(source, set()).add(sink)
        order: list[str] = []
        seen: set[str] = set()

        def visit(t: str) -> None:
            if t in seen:
                return
            seen.add(t)
            for r in sorted(readers.get(t, ()), reverse=True):
                visit(r)
            order.append(t)

        visit(table)
        return list(reversed(order))

    def path(self, start: str, goal: str) -> list[str] | None:
        """A path of tables from ``start`` to ``goal`` along job edges, if one exists."""
        readers: dict[str, list[str]] = {}
        for source, sink in self.edges():
            readers.setdefault(source, []).append(sink)
        stack: list[list[str]] = [[start]]
        seen = {start}
        while stack:
            trail = stack.pop()
            if trail[-1] == goal:
                return trail
            for nxt in readers.get(trail[-1], ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append([*trail, nxt])
        return None

    def external_topics(self) -> list[str]:
        """Topics read by root jobs, running or ended: the ones a barrier's cut covers. A stopped
        job that runs again later finds its topic's offsets in every barrier it missed."""
        return sorted({t for j in self.jobs.values() for t in j.external_topics})

    # -- barriers and exact points -----------------------------------------------------------

    def last_barrier(self) -> int:
        return max(self.barriers, default=0)

    def counts(self, completion: BarrierCompleted) -> bool:
        """Whether a completion still counts: its table is known, it comes from a job that wrote
        the table in the completion's generation, and no later generation restarted from a
        barrier before it (a revision voids what came after)."""
        table = self.tables.get(completion.table)
        if table is None or completion.generation > table.generation:
            return False
        if table.writers is not None and WriterTerm(completion.job_id, completion.generation) not in table.writers:
            return False
        return all(
            completion.barrier <= g.from_barrier
            for g in table.generations
            if g.generation > completion.generation
        )

    def exact_points(self, table: str) -> dict[int, int]:
        """barrier -> Delta version for every barrier that is an exact point of ``table`` (the
        completions that ``counts``; the rule inlined, since ticks and snapshots ask for every table)."""
        t, by_b = self.tables.get(table), self.completions.get(table)
        if t is None or not by_b:
            return {}
        voids = [(g.generation, g.from_barrier) for g in t.generations]
        writers = None if t.writers is None else {(w.job_id, w.generation) for w in t.writers}
        return {b: c.delta_version for b, c in by_b.items() if c.generation <= t.generation
                and (writers is None or (c.job_id, c.generation) in writers)
                and all(c.barrier <= start for generation, start in voids if generation > c.generation)}

    def latest_exact(self, table: str) -> int | None:
        """The newest exact point of ``table``: its newest completion, unless a revision voided it."""
        by_b = self.completions.get(table)
        if not by_b:
            return None
        newest = max(by_b)
        if self.counts(by_b[newest]):
            return newest
        return max(self.exact_points(table), default=None)

    def common_barrier(self, tables: Iterable[str]) -> int | None:
        """The newest barrier that is an exact point of every table (read-committed's b*)."""
        common: set[int] | None = None
        for t in tables:
            points = set(self.exact_points(t))
            common = points if common is None else common & points
        return max(common, default=None) if common else None

    def barrier_at(self, ts_ms: int) -> int | None:
        """The newest barrier announced at or before ``ts_ms``."""
        return max((b for b, a in self.barriers.items() if a.ts_ms <= ts_ms), default=None)

    def last_seen(self, job: JobState) -> int:
        """When ``job`` was last heard of: registered, updated, or committed a barrier (epoch ms)."""
        committed = self.completions.get(job.sink)
        return max(job.updated_at_ms, max(map(_COMMITTED_AT, committed.values())) if committed else 0)

    def pending_sign_of_life(self, table: str) -> int:
        """When pending CTAS ``table`` last showed that a runner means to make it (epoch ms): its
        declaration (a runner starting again declares it again), its job's registration, or a
        renewal by the runner running that job (``RenewJob``, sent from registration on)."""
        declared = self.tables[table].declared_at_ms if table in self.tables else 0
        return max(declared, max((self.last_seen(j) for j in self.jobs.values() if j.sink == table), default=0))

    def owed_since(self, job: JobState, now_ms: int) -> int:
        """Since when ``job`` has been silent with work to do (epoch ms): the later of when it was
        last heard of and when the oldest barrier it has not committed was announced; ``now_ms``
        while none is. A job with nothing to do is waiting, not silent: while another job holds
        the clock back, the jobs that are done keep their liveness and their place in pacing."""
        done = self.done_through(job)
        if done >= self.last_barrier():
            return now_ms
        owed = self.barriers.get(done + 1)  # (none kept: it owes barriers pruned long ago)
        return max(self.last_seen(job), owed.ts_ms if owed is not None else 0)

    def live_jobs(self, now_ms: int, liveness_ms: int) -> list[JobState]:
        """Running jobs not silent past ``liveness_ms`` with work to do (``owed_since``): only these
        hold barriers back, so one dead job never freezes the topology. A job still creating its
        CTAS table holds none back either: it is kept alive by renewals however long it waits for
        its sources, and its first commit covers every barrier up to then anyway."""
        return sorted((j for j in self.active_jobs() if self.is_live(j, now_ms, liveness_ms)), key=lambda j: j.job_id)

    def is_live(self, job: JobState, now_ms: int, liveness_ms: int) -> bool:
        """Whether ``job`` is one of ``live_jobs``: RUNNING, its table created, not silent past the window."""
        return job.status == JobStatus.RUNNING and self.created(job.sink) and not self._silent(job, now_ms, liveness_ms)

    def status_of(self, job: JobState, now_ms: int, liveness_ms: int) -> str:
        """The status to show: the stored one, or STALLED for a RUNNING job silent past ``liveness_ms``
        with work to do.

        >>> from coordinator.domain import BarrierAnnounced, JobState, fold_all
        >>> j = JobState("j", "t", updated_at_ms=1_000)
        >>> s = fold_all([j, BarrierAnnounced(1, 1_500)])
        >>> s.status_of(j, now_ms=2_000, liveness_ms=30_000), s.status_of(j, now_ms=60_000, liveness_ms=30_000)
        ('RUNNING', 'STALLED')
        >>> MetaState().status_of(j, now_ms=60_000, liveness_ms=30_000)  # no barrier to commit: waiting
        'RUNNING'
        """
        if job.status == JobStatus.RUNNING and self._silent(job, now_ms, liveness_ms):
            return JobStatus.STALLED.value
        return str(job.status)

    def _silent(self, job: JobState, now_ms: int, liveness_ms: int) -> bool:
        return now_ms - self.owed_since(job, now_ms) > liveness_ms

    def inflight(self, jobs: Iterable[JobState]) -> int:
        """How many announced barriers are not yet an exact point of every given job's sink
        (counting only barriers announced after the job started)."""
        last = self.last_barrier()
        behind = [last - self.done_through(j) for j in jobs]
        return max(0, *behind) if behind else 0

    def done_through(self, job: JobState) -> int:
        """The newest barrier ``job``'s table holds (its newest exact point), or where the job started."""
        return max(self.latest_exact(job.sink) or 0, job.start_barrier)


class ChangeLog:
    """What ``fold`` changed, newest last, so the leader's clock (``coordinator.domain.pacer``)
    replans what changed instead of the whole topology. Not part of the state's value (a copy
    starts a new log; equality ignores it): a reader that missed entries replans everything.

    Completions, renewals and announcements are logged one by one (``("completed", table,
    barrier)``, ``("renewed", job_id)``, ``("announced", barrier)``); anything else (a table or job record that changed, a
    tombstone) is a reshape that voids what a reader derived. The log keeps at most ``LIMIT``
    entries; ``since`` returns None to a reader whose entries were dropped.

    >>> log = ChangeLog()
    >>> log.logged(("announced", 1)); log.logged(("announced", 2)); seen = log.seq
    >>> log.logged(("announced", 1)); log.since(seen)
    [('announced', 1)]
    >>> log.reshaped(); log.since(seen) is None
    True
    """

    LIMIT = 10_000  # the leader reads it every tick; a reader that falls further behind replans all

    def __init__(self) -> None:
        self.seq = 0
        self.reshaped_at = 0  # the seq of the newest reshape (or of the newest dropped entry)
        self._recent: dict[tuple[Hashable, ...], int] = {}

    def logged(self, key: tuple[Hashable, ...]) -> None:
        self.seq += 1
        self._recent.pop(key, None)
        self._recent[key] = self.seq
        if len(self._recent) > self.LIMIT:
            dropped = next(iter(self._recent))
            self.reshaped_at = self._recent.pop(dropped)

    def reshaped(self) -> None:
        self.seq += 1
        self.reshaped_at = self.seq
        self._recent.clear()

    def since(self, seq: int) -> list[tuple[Hashable, ...]] | None:
        """The keys changed after ``seq`` (oldest first), or None if a reshape came after it."""
        if self.reshaped_at > seq:
            return None
        out: list[tuple[Hashable, ...]] = []
        for key in reversed(self._recent):
            if self._recent[key] <= seq:
                break
            out.append(key)
        out.reverse()
        return out
