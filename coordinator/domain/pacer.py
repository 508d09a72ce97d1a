"""The leader's barrier clock kept between ticks: the pacing replanned from what changed.

``barriers.next_due`` plans from scratch, at a cost linear in the live jobs and the barriers in
flight, and the leader replans every tick (tens of ms) after new facts. Most facts touch one
job, so the ``Pacer`` keeps per live job its pace, its path from an announcement, and when it
is estimated to finish each barrier in flight, and redoes only the jobs that the state's
``ChangeLog`` names, their readers, and (on a new barrier) the last step of every job.

An estimate is clamped to "now" as barriers are played, so estimates are kept as max-plus
pairs ``(a, b)`` meaning ``max(a, now + b)``: valid whatever the tick's time, which turns the
due time into ``max(earliest, max a, now + max b)`` over the jobs. A reshape (a job or table
record, a tombstone), another state object, a live job running out of liveness or a barrier
that strides other tables (``strides``: such jobs and their readers are not planned) replans all.
It gives exactly what ``barriers.next_due`` gives; a test checks that fact by fact.

Example::

    pacer = Pacer(BarrierConfig(interval_ms=500))
    due = pacer.next_due(state, now_ms)  # every tick, with the same pacer and state
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from coordinator.domain.barriers import BarrierConfig, announcement, strides
from coordinator.domain.events import BarrierAnnounced, CutEntry, JobState, JobStatus, TableStride
from coordinator.domain.pacing import (
    JobPace,
    Sample,
    committed_through,
    completion,
    pace_of,
    pace_sample,
    upstream_first,
    window,
)
from coordinator.domain.state import MetaState
from coordinator.domain.strides import paced_jobs

_NEVER = float("-inf")
Pair = tuple[float, float]  # (a, b): max(a, now + b)


@dataclass
class _Plan:
    """What the pacer keeps for one live job."""

    job: JobState
    upstream: list[_Plan] | None = None  # the live writers of its sources (None: a source has none)
    pace: JobPace = JobPace()
    pace_end: int | None = None  # the barrier its pace window ended at
    samples: dict[int, Sample] | None = None  # barrier -> (cost, lag) in that window
    floor: int = 0  # its newest exact point (or start barrier): how far behind it is
    path: float | None = None  # from an announcement to the job starting it, nothing queued
    finish: dict[int, Pair] = field(default_factory=dict)  # barrier in flight -> when it is committed
    share: Pair | None = None  # (a, b) for the due time: when it is free, less its path


class Pacer:
    """``next_due`` and ``plan_barrier`` for a leader that asks every tick (see the module)."""

    def __init__(self, config: BarrierConfig) -> None:
        self.config = config
        self._state: MetaState | None = None
        self._seq = -1
        self._expiry = float("inf")
        self._last = 0
        self._plans: dict[str, _Plan] = {}
        self._unpaced: set[str] = set()  # live jobs not planned: strided tables' and their readers'
        self._strides: tuple[TableStride, ...] = ()  # as of the newest barrier
        self._rank: dict[str, int] = {}
        self._sinks: dict[str, _Plan] = {}  # table -> its live writer
        self._readers: dict[str, list[str]] = {}  # table -> live jobs reading it
        self._asleep: dict[str, list[JobState]] = {}  # table -> running jobs writing it, not live
        self._latest: Pair = (_NEVER, _NEVER)  # the jobs' shares, maximised: when the last of them is free
        self._lowest = 0  # the jobs' floors, minimised: how far the furthest behind stands

    def next_due(self, state: MetaState, now_ms: int) -> int | None:
        """What ``barriers.next_due(state, now_ms, config)`` gives, replanning what changed."""
        self._update(state, now_ms)
        if self._inflight() > self.config.max_inflight:
            return None
        announced = state.barriers.get(self._last)
        earliest = (announced.ts_ms if announced is not None else 0) + self.config.interval_ms
        return int(max(earliest, self._latest[0], now_ms + self._latest[1]))

    def plan_barrier(self, state: MetaState, now_ms: int, cut: Iterable[CutEntry]) -> BarrierAnnounced | None:
        """What ``barriers.plan_barrier(state, now_ms, cut, config)`` gives."""
        self._update(state, now_ms)
        if self._inflight() > self.config.max_inflight:
            return None
        return announcement(state, now_ms, cut, strides(state, state.live_jobs(now_ms, self.config.liveness_ms),
                                                        self.config))

    def paces(self) -> dict[str, JobPace]:
        """Per paced live job (not strided, ``strides``), what a barrier costs it as of the last plan
        (the slowest one paces the clock)."""
        return {job_id: plan.pace for job_id, plan in self._plans.items()}

    def _inflight(self) -> int:
        return max(0, self._last - self._lowest) if self._plans else 0

    def _aggregate(self) -> None:
        """The due time's and backpressure's figures over every job, after a replan changed some."""
        shares = [p.share for p in self._plans.values() if p.share is not None]
        self._latest = (max(s[0] for s in shares), max(s[1] for s in shares)) if shares else (_NEVER, _NEVER)
        self._lowest = min((p.floor for p in self._plans.values()), default=0)

    # -- keeping up with the state -----------------------------------------------------------

    def _update(self, state: MetaState, now_ms: int) -> None:
        changes = state.changes.since(self._seq) if state is self._state else None
        if changes is None or now_ms > self._expiry:
            self._rebuild(state, now_ms)
            return
        self._seq = state.changes.seq
        dirty: set[str] = set()
        repace: dict[str, int] = {}  # job -> the oldest barrier whose (cost, lag) may have changed

        def touched(job_id: str, barrier: int) -> None:
            repace[job_id] = min(barrier, repace.get(job_id, barrier))

        for key in changes:
            if key[0] == "announced":
                self._last = state.last_barrier()
                if state.barriers[self._last].strides != self._strides:
                    self._rebuild(state, now_ms)
                    return
                dirty.update(self._plans)
                for plan in self._plans.values():
                    if not plan.job.sources:  # a root job's input is ready when a barrier is announced
                        touched(plan.job.job_id, int(key[1]))  # type: ignore[call-overload]
            elif key[0] == "renewed":
                job = state.jobs[str(key[1])]
                if job.job_id not in self._plans and job.job_id not in self._unpaced and \
                        state.is_live(job, now_ms, self.config.liveness_ms):
                    self._rebuild(state, now_ms)
                    return
            else:
                table, barrier = str(key[1]), int(key[2])  # type: ignore[call-overload]
                if any(state.is_live(job, now_ms, self.config.liveness_ms) for job in self._asleep.get(table, ())):
                    self._rebuild(state, now_ms)
                    return
                writer = self._sinks.get(table)
                if writer is not None:
                    writer.floor = state.done_through(writer.job)
                    dirty.add(writer.job.job_id)
                    touched(writer.job.job_id, barrier)
                for reader in self._readers.get(table, ()):
                    dirty.add(reader)
                    touched(reader, barrier)
        if dirty:
            self._replay(state, dirty, repace)
            self._aggregate()

    def _rebuild(self, state: MetaState, now_ms: int) -> None:
        self._state, self._seq = state, state.changes.seq
        live = state.live_jobs(now_ms, self.config.liveness_ms)
        ids = {j.job_id for j in live}
        self._expiry = min((state.owed_since(j, now_ms) + self.config.liveness_ms for j in live), default=float("inf"))
        self._asleep = {}
        for job in state.active_jobs():
            if job.status == JobStatus.RUNNING and job.job_id not in ids:
                self._asleep.setdefault(job.sink, []).append(job)
        paced = paced_jobs(state, live)
        self._unpaced = ids - {j.job_id for j in paced}
        announced = state.barriers.get(state.last_barrier())
        self._strides = announced.strides if announced is not None else ()
        order = upstream_first(paced)
        self._rank = {j.job_id: i for i, j in enumerate(order)}
        self._plans = {j.job_id: _Plan(j) for j in order}
        self._sinks = {j.sink: self._plans[j.job_id] for j in paced}  # as due_at: the last one wins
        self._readers = {}
        for job in order:
            plan = self._plans[job.job_id]
            ups = [self._sinks.get(s) for s in job.sources]
            plan.upstream = None if None in ups else [u for u in ups if u is not None]
            plan.floor = state.done_through(job)
            for source in job.sources:
                self._readers.setdefault(source, []).append(job.job_id)
        self._last = state.last_barrier()
        self._replay(state, set(self._plans), {})
        self._aggregate()

    # -- playing the barriers in flight ------------------------------------------------------

    def _replay(self, state: MetaState, dirty: set[str], repace: dict[str, int]) -> None:
        """Play ``dirty`` jobs again, upstream first; a job whose estimates changed makes its readers dirty."""
        heap = [(self._rank[j], j) for j in dirty]
        heapq.heapify(heap)
        done: set[str] = set()
        while heap:
            _, job_id = heapq.heappop(heap)
            if job_id in done:
                continue
            done.add(job_id)
            plan = self._plans[job_id]
            before = (plan.pace, plan.path, plan.finish)
            self._play(state, plan, repace.get(job_id))
            if (plan.pace, plan.path, plan.finish) != before:
                for reader in self._readers.get(plan.job.sink, ()):
                    if reader not in done:
                        heapq.heappush(heap, (self._rank[reader], reader))

    def _play(self, state: MetaState, plan: _Plan, touched: int | None) -> None:
        """``due_at``'s loop for one job, with estimates as pairs."""
        job, last = plan.job, self._last
        through = committed_through(state, job, last)
        self._repace(state, plan, through or last, touched)
        ups = plan.upstream
        if ups is None or any(u.path is None for u in ups):
            plan.path, plan.finish, plan.share = None, {}, None  # no new barrier reaches it
            return
        cost, lag = plan.pace.cost_ms, plan.pace.lag_ms
        plan.path = path = lag + max((u.path + u.pace.cost_ms for u in ups if u.path is not None), default=0.0)
        done = completion(state, job.sink, through) if through is not None else None
        free: Pair = (float(done.committed_at_ms) if done is not None else 0.0, _NEVER)
        finish: dict[int, Pair] = {}
        for b in range((through or job.resume_barrier) + 1, last + 1):
            arrive = self._arrival(state, job, b, ups)
            if arrive is None:
                break  # not announced (or an upstream job dropped it): nothing more to play
            free = (max(arrive[0] + lag, free[0]) + cost, max(max(arrive[1] + lag, free[1]) + cost, 0.0))
            finish[b] = free
        plan.finish = finish
        plan.share = (free[0] - path, free[1] - path)

    @staticmethod
    def _repace(state: MetaState, plan: _Plan, end: int, touched: int | None) -> None:
        """``job_pace(state, job, end)``, keeping the (cost, lag) of barriers that did not change:
        a job committing its next barrier costs one new sample, not a whole window."""
        old, span = plan.pace_end, window(end)
        if plan.samples is None or old is None or end < old or (touched is not None and touched <= old):
            plan.samples = {b: s for b in span if (s := pace_sample(state, plan.job, b)) is not None}
        elif end > old:
            for b in [b for b in plan.samples if b < span.start]:
                del plan.samples[b]
            for b in range(max(old + 1, span.start), end + 1):
                if (sample := pace_sample(state, plan.job, b)) is not None:
                    plan.samples[b] = sample
        else:
            return  # nothing in its window changed
        plan.pace, plan.pace_end = pace_of(plan.samples.values()), end

    @staticmethod
    def _arrival(state: MetaState, job: JobState, barrier: int, upstream: list[_Plan]) -> Pair | None:
        if not job.sources:
            announced = state.barriers.get(barrier)
            return None if announced is None else (float(announced.ts_ms), _NEVER)
        a = b = _NEVER
        for writer in upstream:
            done = completion(state, writer.job.sink, barrier)
            at = (float(done.committed_at_ms), _NEVER) if done is not None else writer.finish.get(barrier)
            if at is None:
                return None
            a, b = max(a, at[0]), max(b, at[1])
        return a, b
