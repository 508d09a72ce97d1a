"""Barrier work planning, kept pure: which barriers a job commits and what each one covers.

A root job reads, per barrier, the offset range of each topic-partition between the cut of the
barrier it processed before (for its table's first barrier: the offsets its start rule resolved
to, ``coordinator.domain.starts``) and this barrier's cut; an intermediate job reads its sources at
their exact points of the barrier. A job further behind than the catch-up stride commits only
at multiples of it (``barriers.commit_points``), and a strided table only at multiples of its
stride (``strides``). The Spark barrier source
(``spark_jobs.runtime.epochs``) calls ``work_for`` and hands each ``BarrierWork`` to the job.

Example::

    >>> from coordinator.domain import BarrierAnnounced, CutEntry, JobState, TableState, fold_all
    >>> state = fold_all([TableState("t", "root"), JobState("ingest", "t", external_topics=("src",)),
    ...                   BarrierAnnounced(1, 1000, (CutEntry("src", 0, 5),)),
    ...                   BarrierAnnounced(2, 2000, (CutEntry("src", 0, 9),))])
    >>> [(w.barrier, w.offsets) for w in work_for(state, state.jobs["ingest"], 0, 2)]  # doctest: +NORMALIZE_WHITESPACE
    [(1, [OffsetRange(topic='src', partition=0, start=-2, end=5)]),
     (2, [OffsetRange(topic='src', partition=0, start=5, end=9)])]
"""

from __future__ import annotations

import json
from dataclasses import astuple, dataclass, field, replace
from typing import Any

from coordinator.domain.barriers import commit_points
from coordinator.domain.errors import LockstepError
from coordinator.domain.events import END_STATUSES, NO_PARTITIONS, JobState, OffsetRange
from coordinator.domain.starts import EARLIEST_OFFSET, begin_offsets
from coordinator.domain.state import MetaState
from coordinator.domain.strides import commit_point, commits_at

EARLIEST = EARLIEST_OFFSET  # an offset range's start when the partition is read from its first record
EMPTY = -1  # restore_to's version for a revision from scratch (--full): no rows


@dataclass(frozen=True)
class BarrierWork:
    """One barrier for one job: the unit a job commits."""

    barrier: int
    generation: int
    ts_ms: int
    # root jobs: per topic-partition [start, end) offsets; start EARLIEST: the partition's first record
    offsets: list[OffsetRange] = field(default_factory=list)
    # intermediate jobs: source table -> Delta version at this barrier
    source_versions: dict[str, int] = field(default_factory=dict)
    # the first barrier of a revised root job: first put its table back to its state at the
    # revision's barrier, (barrier, version), where version EMPTY means no rows (--full)
    restore_to: tuple[int, int] | None = None

    def to_json(self) -> str:
        """The ``info`` column of the barrier source's rows (what is not a column of its own)."""
        return json.dumps({"offsets": [astuple(o) for o in self.offsets], "source_versions": self.source_versions,
                           "restore_to": self.restore_to})

    @classmethod
    def from_row(cls, row: Any) -> BarrierWork:
        """From a row of the barrier source (anything indexable by column name)."""
        info = json.loads(row["info"])
        return cls(row["barrier"], row["generation"], row["ts_ms"],
                   [OffsetRange(*o) for o in info["offsets"]], info["source_versions"],
                   tuple(info["restore_to"]) if info.get("restore_to") else None)


def job_to_run(state: MetaState, job_id: str) -> JobState:
    """The job ``job_id`` as the coordinator knows it, or an error that says why it cannot run
    (its runner reports it and retries) instead of stalling it."""
    job = state.jobs.get(job_id)
    if job is None:
        raise LockstepError(f"job {job_id!r} is not registered with the coordinator (run `lockstep run` first)")
    if job.status not in END_STATUSES and job.sink not in state.tables:
        # its commits would never count
        raise LockstepError(f"table {job.sink!r} of job {job_id!r} is not in the coordinator's catalog any "
                            "more (dropped while the job ran); run the pipeline again to declare it")
    return job


def ready_barrier(state: MetaState, job: JobState) -> int:
    """The newest barrier ``job`` may process now: one its table commits (a strided table's
    batch never ends on a barrier it folds into the next, so the next batch starts where this
    one's commit ended)."""
    ready = state.last_barrier() if job.external_topics else state.common_barrier(job.sources) or 0
    return commit_point(state, job.sink, ready)


def work_for(state: MetaState, job: JobState, start: int, end: int, stride: int = 10) -> list[BarrierWork]:
    """The barriers in ``(start, end]`` that ``job`` commits, with what it needs for each. A job
    more than ``stride`` barriers behind folds them into commits at multiples of ``stride``; a
    root job then reads from the cut of the barrier it processed before, and skips a barrier
    whose cut did not measure all its topics. Barriers the job's table already has as exact
    points (a restart whose checkpoint lagged its last commit) are skipped: it goes on after its
    newest one, whose records pruning keeps (``pruning``)."""
    done = state.latest_exact(job.sink)
    if done is not None and job.resume_barrier <= done <= end:
        start = max(start, done)
    out: list[BarrierWork] = []
    previous = start
    points = {s: state.exact_points(s) for s in job.sources}  # empty for root jobs
    restore = _restore_point(state, job) if job.external_topics and start == job.resume_barrier else None
    table = state.tables.get(job.sink)
    begin = begin_offsets(table) if table is not None else {}  # where the table's start rule said to begin
    reached: dict[tuple[str, int], int] | None = None  # where the barrier planned before in this call ended
    for b in commit_points(start, end, stride):
        announced = state.barriers.get(b)
        if announced is None or not all(b in p for p in points.values()) or not commits_at(state, job.sink, b):
            continue
        work = BarrierWork(b, job.generation, announced.ts_ms)
        if job.external_topics:
            if not set(job.external_topics) <= {c.topic for c in announced.cut}:
                # cut while the job's registration was on its way to the leader: what its topics
                # held at this barrier is unknown, so it must not claim it (a table of a source's
                # transactions would hold fewer of them than its siblings do); the next cut has them
                continue
            first = previous <= job.resume_barrier and not state.completions.get(job.sink, {}).get(previous)
            ends = {(c.topic, c.partition): c.offset for c in announced.cut
                    if c.topic in job.external_topics and c.partition != NO_PARTITIONS}
            if reached is None:
                reached = begin if first else _cut_before(state, previous, set(ends), job.sink)
            starts = {tp: reached.get(tp, EARLIEST) for tp in ends}
            # a cut measured before the start rule was resolved, but announced after the job registered,
            # ends before the start: nothing to read there yet
            offsets = [OffsetRange(t, p, starts[t, p], max(end, starts[t, p])) for (t, p), end in ends.items()]
            reached = {(o.topic, o.partition): o.end for o in offsets}
            out.append(replace(work, offsets=offsets, restore_to=None if out else restore))
        else:
            out.append(replace(work, source_versions={s: p[b] for s, p in points.items()}))
        previous = b
    return out


def _restore_point(state: MetaState, job: JobState) -> tuple[int, int] | None:
    """Where a revised root job's table goes back to before it re-ingests: (the revision's
    barrier, the version of its exact point there, or EMPTY from scratch). None if not revised."""
    b = job.restart_from_barrier
    if b is None:
        return None
    return b, state.exact_points(job.sink).get(b, EMPTY) if b else EMPTY


def _cut_before(state: MetaState, barrier: int, needed: set[tuple[str, int]], sink: str) -> dict[tuple[str, int], int]:
    """Where each needed topic-partition stood at ``barrier``: where ``sink``'s completion of a
    barrier ended reading it, else the barrier's cut, from the newest barrier at or before
    ``barrier`` that has the partition (a cut taken before a topic was read lacks it). The
    completion comes first: a barrier still in flight when pruning passed it loses its record,
    and its completion, once folded, is the table's newest exact point and is kept."""
    where: dict[tuple[str, int], int] = {}
    completions = state.completions.get(sink, {})
    for b in range(barrier, 0, -1):
        if needed <= where.keys():
            break
        done = completions.get(b)
        for r in done.source_offsets if done is not None else ():
            where.setdefault((r.topic, r.partition), r.end)
        for c in state.barriers[b].cut if b in state.barriers else ():
            where.setdefault((c.topic, c.partition), c.offset)
    return where
