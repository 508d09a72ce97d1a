"""The worker's ``/metrics``, by the book (``prometheus_client``): seconds, histograms, counters.

Two kinds of figures:

* **observed** as the worker folds each completion (``FoldMetrics.observe``): per table the E2E
  delay (commit time minus the barrier's time) and per job the time one barrier took (started ->
  committed) as histograms; rows in, rejected and committed as counters. A worker counts what it
  folds from its start on (at start: the completions the state topics still hold), once per
  table, generation and barrier;
* **read from the state** at each scrape (``state_families``): the newest barrier, the state's
  size, per table the barriers not yet committed and its freshness (now minus the time of its
  newest exact barrier: it keeps growing while a job stalls), per root table its Kafka backlog
  (records its job has still to read; the worker asks Kafka for the end offsets), per job whether
  it is STALLED, and the worker's own counters.

Example::

    metrics = FoldMetrics()
    reader.on_fold = metrics.observe                 # the worker's state follower
    body = exposition(metrics, state, counters, now_ms, liveness_ms)   # what GET /metrics returns
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from coordinator.domain.events import BarrierCompleted, JobStatus
from coordinator.domain.state import MetaState

# seconds: a barrier's delay runs from tens of ms (an idle coordinator) to minutes (a backlog)
DELAY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class FoldMetrics:
    """Histograms and counters fed by every completion the worker folds (see the module)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.e2e = Histogram("lockstep_e2e_delay_seconds", "A barrier's commit time minus the barrier's time, per table.",
                             ["table"], buckets=DELAY_BUCKETS, registry=self.registry)
        self.barrier = Histogram("lockstep_job_barrier_seconds", "What one barrier took a job: started -> committed.",
                                 ["job"], buckets=DELAY_BUCKETS, registry=self.registry)
        self.rows_in = Counter("lockstep_rows_in", "Records a root job read, per table.", ["table"], registry=self.registry)
        self.rows_rejected = Counter("lockstep_rows_rejected", "Records a root job sent to its dead letters, per table.",
                                     ["table"], registry=self.registry)
        self.rows_committed = Counter("lockstep_rows_committed", "Rows a job committed, per table.", ["table"],
                                      registry=self.registry)
        self._counted: dict[str, tuple[int, int]] = {}  # table -> newest (generation, barrier) observed

    def observe(self, state: MetaState, event: object) -> None:
        """Called after each fold; a completion newer than the table's last one observed counts."""
        if not isinstance(event, BarrierCompleted) or event.table not in state.tables:
            return
        at = (event.generation, event.barrier)
        if at <= self._counted.get(event.table, (-1, -1)):
            return  # published again after a restart, or older than one seen: counted already
        self._counted[event.table] = at
        announced = state.barriers.get(event.barrier)
        if announced is not None and event.committed_at_ms:
            self.e2e.labels(event.table).observe(max(0, event.committed_at_ms - announced.ts_ms) / 1000)
        if event.started_at_ms and event.committed_at_ms:
            self.barrier.labels(event.job_id).observe(max(0, event.committed_at_ms - event.started_at_ms) / 1000)
        self.rows_in.labels(event.table).inc(event.rows_in)
        self.rows_rejected.labels(event.table).inc(event.rows_rejected)
        self.rows_committed.labels(event.table).inc(event.rows_out)


def state_families(state: MetaState, counters: Mapping[str, int], now_ms: int, liveness_ms: int,
                   backlog: Mapping[str, int] | None = None) -> Iterator[Any]:
    """The figures read from the state and the worker's counters (and ``backlog``, per root
    table the records its job has still to read), as metric families."""
    yield GaugeMetricFamily("lockstep_last_barrier", "Newest announced barrier id.", value=state.last_barrier())
    yield GaugeMetricFamily("lockstep_state_records", "Records of the coordinator's state (pruning keeps it bounded).",
                            value=state.records())
    stalled = GaugeMetricFamily("lockstep_job_stalled", "1 while a RUNNING job is silent past the liveness window.",
                                labels=["job"])
    for job_id, job in sorted(state.jobs.items()):
        if job.status == JobStatus.RUNNING:
            stalled.add_metric([job_id], int(state.status_of(job, now_ms, liveness_ms) == JobStatus.STALLED))
    yield stalled
    lag = GaugeMetricFamily("lockstep_barrier_lag", "Announced barriers not yet an exact point of the table.",
                            labels=["table"])
    fresh = GaugeMetricFamily("lockstep_table_freshness_seconds", "Now minus the time of the table's newest exact "
                              "barrier: what a read-committed reader of it misses; grows while its job stalls.",
                              labels=["table"])
    last = state.last_barrier()
    for table in state.catalog():
        newest = state.latest_exact(table)
        lag.add_metric([table], last - (newest or 0))
        announced = state.barriers.get(newest) if newest is not None else None
        if announced is not None:
            fresh.add_metric([table], max(0, now_ms - announced.ts_ms) / 1000)
    yield lag
    yield fresh
    if backlog is not None:
        behind = GaugeMetricFamily("lockstep_kafka_backlog_records", "Records in a root table's Kafka topics that its "
                                   "newest exact barrier does not hold yet: what its job has still to read.",
                                   labels=["table"])
        for table, records in sorted(backlog.items()):
            behind.add_metric([table], records)
        yield behind
    for name, value in sorted(counters.items()):
        yield CounterMetricFamily(f"lockstep_{name}", f"The worker's {name.replace('_', ' ')} since it started.",
                                  value=value)


class _Snapshot(Collector):
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> Iterator[Any]:
        return iter(self.families)


def exposition(metrics: FoldMetrics, state: MetaState, counters: Mapping[str, int], now_ms: int,
               liveness_ms: int, backlog: Mapping[str, int] | None = None) -> bytes:
    """The Prometheus text exposition of everything above (no backlog gauge without ``backlog``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(list(state_families(state, counters, now_ms, liveness_ms, backlog))))
    return generate_latest(registry) + generate_latest(metrics.registry)
