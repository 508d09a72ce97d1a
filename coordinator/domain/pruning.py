"""Which barrier and completion records the coordinator can forget, kept pure.

Every barrier is its own compacted key and so is every completion; without pruning the state
grows by (tables + 1) records a barrier, and every scan of it with them. Below the retention
floor (the newest ``retain_barriers`` barriers stay, the same horizon as-of reads, ``lockstep
revise`` and vacuum use) a record goes unless something can still need it:

* each table's newest exact point (readers, vacuum and the job that resumes from it);
* the barrier a job resumes after (a stopped root job re-reads its topic from that cut);
* the exact points a repeatable-read lease holds.

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

from coordinator.domain.events import Tombstone, barrier_key, completion_key
from coordinator.domain.state import MetaState


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
    """Tombstones for at most ``limit`` records below the floor that nothing needs, oldest first."""
    floor = retention_floor(state, retain_barriers)
    keep = protected_barriers(state)
    out: list[Tombstone] = []
    old = sorted({b for b in state.barriers if b <= floor} |
                 {b for by_b in state.completions.values() for b in by_b if b <= floor})
    for b in old:
        if b in keep:
            continue
        if b in state.barriers:
            out.append(Tombstone(barrier_key(b)))
        out += [Tombstone(completion_key(t, b)) for t, by_b in sorted(state.completions.items()) if b in by_b]
        if len(out) >= limit:
            break
    return out
