"""The jobs' own Prometheus figures, from the process that runs them (``lockstep run
--metrics-address HOST:PORT``): what each barrier cost the job as it saw it, phase by phase, so
a slow table can be traced to planning, the Spark write or table upkeep without the coordinator.

* ``lockstep_job_commit_seconds{job}``: a barrier from its start to the published completion;
* ``lockstep_job_phase_seconds{job,phase}``: each phase the job timed (``PhaseTime``);
* ``lockstep_job_barriers_committed_total{job}``, ``lockstep_job_rows_committed_total{job}``;
* ``lockstep_job_restarts_total{job}``: restarts after a failure (the Supervisor's);
* ``lockstep_job_stuck_restarts_total{job}``: of those, the watchdog's (barriers waited, nothing moved).

Example::

    serve("127.0.0.1:9108")        # then: curl 127.0.0.1:9108/metrics
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from coordinator.domain.errors import UsageError
from coordinator.domain.events import BarrierCompleted

BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)  # seconds, as the worker's


class JobMetrics:
    """One registry per process: every job the process runs adds its labels."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.commit = Histogram("lockstep_job_commit_seconds", "A barrier's work in the job: started -> completion "
                                "published.", ["job"], buckets=BUCKETS, registry=self.registry)
        self.phase = Histogram("lockstep_job_phase_seconds", "Time a job spent in one phase of a barrier.",
                               ["job", "phase"], buckets=BUCKETS, registry=self.registry)
        self.barriers = Counter("lockstep_job_barriers_committed", "Barriers the job committed.", ["job"],
                                registry=self.registry)
        self.rows = Counter("lockstep_job_rows_committed", "Rows the job committed.", ["job"], registry=self.registry)
        self.restarts = Counter("lockstep_job_restarts", "Restarts of the job after a failure.", ["job"],
                                registry=self.registry)
        self.stuck = Counter("lockstep_job_stuck_restarts", "Restarts of the job by the watchdog: barriers were ready "
                             "and neither its table nor its Spark work moved for LOCKSTEP_STUCK_AFTER_S.", ["job"],
                             registry=self.registry)

    def committed(self, fact: BarrierCompleted) -> None:
        """Count a completion the job published."""
        self.barriers.labels(fact.job_id).inc()
        self.rows.labels(fact.job_id).inc(fact.rows_out)
        if fact.started_at_ms and fact.committed_at_ms:
            self.commit.labels(fact.job_id).observe(max(0, fact.committed_at_ms - fact.started_at_ms) / 1000)
        for phase in fact.phases:
            self.phase.labels(fact.job_id, phase.name).observe(phase.ms / 1000)


job_metrics = JobMetrics()


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` for the metrics endpoint, or a UsageError that says how to write it.

    >>> parse_address("127.0.0.1:9108")
    ('127.0.0.1', 9108)
    """
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--metrics-address {text!r} is not HOST:PORT; e.g. --metrics-address 127.0.0.1:9108 "
                         "(0.0.0.0:9108 to be scraped from other machines)")
    return host, int(port)


def serve(address: str) -> None:
    """Serve this process's job metrics at ``http://ADDRESS/metrics`` (a daemon thread)."""
    host, port = parse_address(address)
    try:
        start_http_server(port, addr=host, registry=job_metrics.registry)
    except OSError as exc:
        raise UsageError(f"--metrics-address {address}: cannot listen there ({exc.strerror}); pick a free port") from exc
