"""Which barrier and completion records the coordinator can forget, kept pure.

Every barrier is its own compacted key and so is every completion; without pruning the state
grows by (tables + 1) records a barrier, and every scan of it with them. Below the retention
floor (the newest ``retain_barriers`` barriers stay, the same horizon as-of reads, ``lockstep
revise`` and vacuum use) a record goes unless something can still need it:

* each table's newest exact point (readers, vacuum and the job that resumes from it);
* the barrier a job resumes after (a stopped root job re-reads its topic from that cut);
* the exact points a repeatable-read lease holds.

A completion goes only this way (or with its table). Every job principal may write the
completions topic, so it can also write a completion's tombstone; the leader writes back what
such a tombstone erased (``restorable``) unless pruning would have forgotten it too, and Kafka's
compaction then keeps the completion, not the tombstone.

Completions no Lockstep writer makes go whatever the floor: those of a table the registry does
not hold, and those of a barrier more than ``AHEAD`` past the newest one announced (a job
commits only barriers it has seen announced). Any principal that may write completions could
otherwise grow every reader's state without bound.

A stopped job that runs again skips the barriers pruned meanwhile: it commits at the next
retained barrier, reading from where it stopped (root jobs: the cut of its last barrier;
derived jobs: the source versions of its last completion), so nothing is skipped or read twice.

Example::

    >>> from coordinator.domain import BarrierAnnounced, BarrierCompleted, TableState, fold_all
    >>> s = fold_all([TableState("t", "root"), *(BarrierAnnounced(b, b) for b in range(1, 6)),
    ...               *(BarrierCompleted("j", "t", b, 0, b) for b in range(1, 6))])
    >>> [t.key for t in prunable(s, retain_barriers=3)]  # barriers 3, 4 and 5 stay
    ['barrier:1', 'completion:t@1', 'barrier:2', 'completion:t@2']
"""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.domain.events import BarrierCompleted, Tombstone, barrier_key, completion_key
from coordinator.domain.state import MetaState

AHEAD = 1_000


def retention_floor(state: MetaState, retain_barriers: int) -> int:
    """Barriers at or below this are pruned unless protected (0: nothing is). The newest barrier
    always stays: the next one's id continues from it, also after a restart."""
    return max(0, state.last_barrier() - max(retain_barriers, 1))


def protected_barriers(state: MetaState) -> set[int]:
    """Barriers below the floor whose records stay: newest exact points, jobs' resume points, leases."""
    keep = {b for t in state.tables if (b := state.latest_exact(t)) is not None}
    keep |= {j.resume_barrier for j in state.jobs.values()}
    keep |= {lease.barrier for lease in state.leases.values()}
    return keep


def prunable(state: MetaState, retain_barriers: int, limit: int = 10_000) -> list[Tombstone]:
    """Tombstones for at most ``limit`` records: completions no writer makes (see the module), then
    the records below the floor that nothing needs, oldest first."""
    floor = retention_floor(state, retain_barriers)
    keep = protected_barriers(state)
    ahead = state.last_barrier() + AHEAD
    out = [Tombstone(completion_key(t, b)) for t, by_b in sorted(state.completions.items())
           for b in sorted(by_b) if t not in state.tables or b > ahead][:limit]
    old = sorted({b for b in state.barriers if b <= floor} |
                 {b for by_b in state.completions.values() for b in by_b if b <= floor})
    for b in old:
        if b in keep:
            continue
        if b in state.barriers:
            out.append(Tombstone(barrier_key(b)))
        out += [Tombstone(completion_key(t, b)) for t, by_b in sorted(state.completions.items())
                if b in by_b and t in state.tables]
        if len(out) >= limit:
            break
    return out


def restorable(state: MetaState, erased: Iterable[BarrierCompleted], retain_barriers: int) -> list[BarrierCompleted]:
    """Of the completions tombstones ``erased`` (not the leader's own), those pruning would have
    kept: their table is still there and their barrier above the floor or protected (protection
    is judged as if they were still there: an erased newest exact point protects itself).

    >>> from coordinator.domain import BarrierAnnounced, TableState, fold_all
    >>> done = [BarrierCompleted("j", "t", b, 0, b) for b in range(1, 6)]
    >>> s = fold_all([TableState("t", "root"), *(BarrierAnnounced(b, b) for b in range(1, 6)), *done[:-1]])
    >>> [c.barrier for c in restorable(s, [done[-1], done[0]], retain_barriers=3)]  # 1 is below the floor
    [5]
    """
    erased = [c for c in erased if c.table in state.tables and c.barrier not in state.completions.get(c.table, {})]
    if not erased:
        return []
    trial = state.copy()
    for c in erased:
        trial.completions.setdefault(c.table, {})[c.barrier] = c
    floor, keep = retention_floor(trial, retain_barriers), protected_barriers(trial)
    return [c for c in erased if c.barrier in state.barriers and (c.barrier > floor or c.barrier in keep)]
