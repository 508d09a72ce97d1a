"""Fused job groups: which jobs of one ``lockstep run`` share one streaming query.

A derived job whose every source table is written by a job of the same run needs no streaming
query of its own: the runner's driver already knows, from the state it follows, the moment its
sources commit a barrier, and runs the job's barrier right then (``spark_jobs.ops.fused``). So a
root job and the jobs that (transitively) read only tables of the run form one *group*: one
streaming query (the root's), whose commits drive the rest. That saves each member a
micro-batch per barrier (and the wait for it), and a process that follows the coordinator's
state. A job that reads a table written elsewhere (another ``lockstep run``) keeps its own query.

Example::

    >>> from spark_jobs.planning.pipeline import Job
    >>> jobs = [Job("ingest_orders", "orders", external_topics=("orders",)),
    ...         Job("maintain_totals", "totals", sources=("orders",)),
    ...         Job("maintain_top", "top", sources=("totals",)),
    ...         Job("maintain_mixed", "mixed", sources=("orders", "elsewhere"))]
    >>> fused_groups(jobs)
    {'ingest_orders': ('maintain_totals', 'maintain_top')}
"""

from __future__ import annotations

from collections.abc import Sequence

from spark_jobs.planning.pipeline import Job


def fused_groups(jobs: Sequence[Job]) -> dict[str, tuple[str, ...]]:
    """Leader job id -> the job ids that run with it (in ``jobs`` order), for the groups that
    have members. A member reading tables of two groups' leaders joins them into one group (led
    by the first of them)."""
    by_sink = {j.sink: j for j in jobs}
    leader: dict[str, str] = {j.job_id: j.job_id for j in jobs if j.external_topics}

    def root(job_id: str) -> str:
        while leader[job_id] != job_id:
            job_id = leader[job_id]
        return job_id

    changed = True
    while changed:  # a member may read another member: repeat until nothing joins
        changed = False
        for job in jobs:
            if job.job_id in leader or not job.sources or not all(s in by_sink and by_sink[s].job_id in leader
                                                                   for s in job.sources):
                continue
            heads = sorted({root(by_sink[s].job_id) for s in job.sources}, key=[j.job_id for j in jobs].index)
            for other in heads[1:]:
                leader[other] = heads[0]
            leader[job.job_id] = heads[0]
            changed = True
    groups: dict[str, list[str]] = {}
    for job in jobs:
        if job.job_id in leader and not job.external_topics:
            groups.setdefault(root(job.job_id), []).append(job.job_id)
    return {head: tuple(members) for head, members in groups.items()}

