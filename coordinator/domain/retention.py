"""Which Delta versions of a table must stay readable, and why: what ``lockstep vacuum`` keeps.

A version stays when a repeatable-read lease holds it; when a job reads from it next (an
intermediate job reads its sources' changes after the versions it last read), running or
stopped while its table has no other writer (run again, it goes on from there); when it is
the table's newest exact point, or the exact point readers pick now (the newest barrier that
is an exact point of every table); or when it is the exact point of one of the newest
``retain_barriers`` announced barriers. Everything older than the oldest of these may go.

>>> from coordinator.domain import BarrierAnnounced, BarrierCompleted, TableState, fold_all
>>> s = fold_all([TableState("t", "root"), BarrierAnnounced(1, 10), BarrierAnnounced(2, 20),
...               BarrierCompleted("j", "t", 1, 0, 3), BarrierCompleted("j", "t", 2, 0, 5)])
>>> [k.version for k in versions_to_keep(s, "t", retain_barriers=2)]
[3, 5, 5]
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.events import JobState, JobStatus
from coordinator.domain.state import MetaState


@dataclass(frozen=True)
class Keep:
    """Version ``version`` (and every later one) must stay readable because of ``reason``."""

    version: int
    reason: str


def versions_to_keep(state: MetaState, table: str, retain_barriers: int = 0) -> list[Keep]:
    """Why each version of ``table`` that someone needs is needed, oldest first."""
    keeps: list[Keep] = []
    for lease in sorted(state.leases.values(), key=lambda lease: lease.lease_id):
        keeps += [Keep(v.version, f"lease {lease.lease_id} of {lease.holder} holds it (barrier {lease.barrier})")
                  for v in lease.versions if v.table == table]
    for job in sorted(state.jobs.values(), key=lambda j: j.job_id):
        if table not in job.sources or not _reads_again(state, job):
            continue
        done = state.exact_points(job.sink)
        if not done:
            continue
        last = state.completions[job.sink][max(done)]
        when = "next" if job.status == JobStatus.RUNNING else f"when run again ({job.status})"
        keeps += [Keep(v.version, f"job {job.job_id} reads the changes after it {when} (barrier {last.barrier})")
                  for v in last.source_versions if v.table == table]
    points = state.exact_points(table)
    if points:
        newest = max(points)
        keeps.append(Keep(points[newest], f"its newest exact point (barrier {newest})"))
        everyone = state.common_barrier(state.tables)
        if everyone is not None and everyone in points:
            keeps.append(Keep(points[everyone], f"read-committed reads of all tables pick barrier {everyone}"))
        window = [b for b in points if b > state.last_barrier() - retain_barriers]
        if retain_barriers > 0 and window:
            keeps.append(Keep(points[min(window)], f"exact point of barrier {min(window)}, within the newest "
                                                   f"{retain_barriers} barriers (--retain-barriers)"))
    return sorted(keeps, key=lambda k: (k.version, k.reason))


def _reads_again(state: MetaState, job: JobState) -> bool:
    """Whether ``job`` will read its sources from where it stopped: it runs, or it ended and
    its table is still there with no other job writing it (``lockstep drop`` releases it)."""
    if job.status == JobStatus.RUNNING:
        return True
    writer = state.writer_of(job.sink)
    return job.sink in state.tables and (writer is None or writer.job_id == job.job_id)
