"""The barrier clock's decision, kept pure: announce barrier ``last + 1`` now, or hold back.

The Faust leader asks ``next_due`` often (every few tens of ms); once a barrier is due it
measures the cut (end offsets of every external topic in use) and calls ``plan_barrier``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from coordinator.domain.events import BarrierAnnounced, CutEntry, JobState, TableStride
from coordinator.domain.pacing import due_at
from coordinator.domain.state import MetaState
from coordinator.domain.strides import choose_strides, paced_jobs


@dataclass(frozen=True)
class BarrierConfig:
    interval_ms: int = 1000  # the shortest spacing; pacing stretches it to what the slowest job sustains
    max_inflight: int = 3
    liveness_ms: int = 30_000
    catchup_stride: int = 10
    stride_after: int = 3  # a table this many times slower than the rest commits at a stride (0: never)


def commit_points(start: int, end: int, stride: int) -> list[int]:
    """The barriers in ``(start, end]`` a job commits: every one when it is at most ``stride``
    behind; otherwise only multiples of ``stride`` until it is close, so every lagging table
    lands on the same exact points and jobs reading several of them can still align.

    >>> commit_points(0, 3, 10)
    [1, 2, 3]
    >>> commit_points(5, 32, 10)
    [10, 20, 30, 31, 32]
    """
    if end - start <= stride:
        return list(range(start + 1, end + 1))
    folded_to = end - end % stride
    return [b for b in range(start + 1, folded_to + 1) if b % stride == 0] + list(range(folded_to + 1, end + 1))


def next_due(state: MetaState, now_ms: int, config: BarrierConfig = BarrierConfig()) -> int | None:
    """Epoch ms at which the next barrier is due (``coordinator.domain.pacing``), or None while
    more than ``max_inflight`` barriers are incomplete in a live job (backpressure). Jobs of
    strided tables and their readers count for neither (``coordinator.domain.strides``). Planned
    from scratch; the leader asks a ``coordinator.domain.pacer.Pacer``, which gives the same.

    >>> from coordinator.domain.fold import fold_all
    >>> next_due(fold_all([BarrierAnnounced(1, 1000)]), 1200)
    2000
    """
    live = paced_jobs(state, state.live_jobs(now_ms, config.liveness_ms))
    if state.inflight(live) > config.max_inflight:
        return None
    return due_at(state, live, now_ms, config.interval_ms)


def plan_barrier(
    state: MetaState, now_ms: int, cut: Iterable[CutEntry], config: BarrierConfig = BarrierConfig(),
) -> BarrierAnnounced | None:
    """The next barrier, or None while more than ``max_inflight`` are incomplete (backpressure),
    with the tables that commit it only at their stride (``coordinator.domain.strides``).

    Ids continue from the state (so restarts and failover neither skip nor repeat an id) and
    timestamps never go backwards, even if the new leader's clock is behind.

    >>> plan_barrier(MetaState(), 1000, []).barrier
    1
    """
    live = state.live_jobs(now_ms, config.liveness_ms)
    if state.inflight(paced_jobs(state, live)) > config.max_inflight:
        return None
    return announcement(state, now_ms, cut, strides(state, live, config))


def strides(state: MetaState, live: list[JobState], config: BarrierConfig) -> tuple[TableStride, ...]:
    """The strides the next barrier announces, from ``live`` jobs' costs."""
    return choose_strides(state, live, config.stride_after, config.catchup_stride, config.interval_ms)


def announcement(state: MetaState, now_ms: int, cut: Iterable[CutEntry],
                 strides: tuple[TableStride, ...] = ()) -> BarrierAnnounced:
    """Barrier ``last + 1`` with ``cut`` and ``strides``, announced now (and never before the last one)."""
    last = state.barriers.get(state.last_barrier())
    ts = max(now_ms, last.ts_ms if last is not None else 0)
    ordered = tuple(sorted(cut, key=lambda c: (c.topic, c.partition)))
    return BarrierAnnounced(state.last_barrier() + 1, ts, ordered, strides)
