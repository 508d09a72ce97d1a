"""JSON bodies of the REST API, computed from MetaState (no Faust here, so tests call them)."""

from __future__ import annotations

from typing import Any

from coordinator.columns import column_sources, ddl_columns
from coordinator.domain import MetaState
from coordinator.domain.delays import delay_report
from coordinator.domain.events import TableKind, TableState, TableStride
from coordinator.domain.records import to_record
from coordinator.domain.snapshot import Snapshot
from coordinator.domain.starts import rule_of
from coordinator.domain.strides import commits_at, strides_at
from coordinator.settings import Settings


def topology(state: MetaState, now_ms: int, liveness_ms: int) -> dict[str, Any]:
    """Tables in the catalog (CTAS tables not yet created are listed under ``pending`` only), a
    root's with its start rule and the offsets it resolved to; a job's status is STALLED when it
    is RUNNING but silent past the liveness window; ``fused_with`` is the leader of the fused
    group that made its newest commit ("": its own query); ``stride``: a table the newest barrier
    strides (``coordinator.domain.strides``), every how many barriers it commits and why."""
    strided = strides_at(state, state.last_barrier())
    return {
        "tables": {n: {"kind": (t := state.tables[n]).kind, "writer": t.writer, "generation": t.generation,
                       "table_id": t.table_id, "stride": _stride(strided.get(n)), **_start(t)}
                   for n in state.catalog()},
        "pending": state.pending(),
        "jobs": {
            j: {"sink": s.sink, "sources": list(s.sources), "external_topics": list(s.external_topics),
                "status": state.status_of(s, now_ms, liveness_ms), "fused_with": _fused_with(state, j, s.sink)}
            for j, s in sorted(state.jobs.items())
        },
        "edges": [list(e) for e in state.edges()],
    }


def _stride(stride: TableStride | None) -> dict[str, int] | None:
    """A strided table's stride: every how many barriers it commits, its cost and the clock's without it (ms)."""
    return None if stride is None else {"every": stride.every, "cost_ms": stride.cost_ms,
                                        "reference_ms": stride.reference_ms}


def _start(table: TableState) -> dict[str, Any]:
    """A root table's start: its rule, and the offsets it resolved to as [topic, partition, offset]."""
    if table.kind != TableKind.ROOT:
        return {}
    return {"start": rule_of(table), "start_offsets": [[c.topic, c.partition, c.offset] for c in table.start_offsets]}


def snapshot(snap: Snapshot, settings: Settings) -> dict[str, Any]:
    """A read's barrier and versions, and where each table lives, so any engine that reads
    Delta at a version (delta-rs, DuckDB, polars, Spark) can do the rest. For an object-store
    warehouse, ``storage`` says how to reach it (never credentials: each reader has its own);
    engines other than Spark's Hadoop name ``s3a://`` locations ``s3://``.

    >>> snapshot(Snapshot(3, {"a": 7}, 1000), Settings(warehouse="s3a://lake/wh"))["locations"]
    {'a': 's3a://lake/wh/a'}
    """
    body: dict[str, Any] = {"barrier": snap.barrier, "versions": snap.versions, "data_ts_ms": snap.data_ts_ms,
                            "locations": {name: settings.table_location(name) for name in snap.versions}}
    if str(settings.warehouse).startswith("s3a://"):
        endpoint = settings.s3.endpoint
        body["storage"] = {"s3": {"endpoint": endpoint, "region": "us-east-1" if endpoint else None,
                                  "url_style": "path" if endpoint else "vhost"}}
    return body


def _fused_with(state: MetaState, job_id: str, sink: str) -> str:
    done = state.completions.get(sink)
    newest = done[max(done)] if done else None
    return newest.fused_with if newest is not None and newest.job_id == job_id else ""


def table(state: MetaState, name: str) -> dict[str, Any] | None:
    t = state.tables.get(name)
    if t is None or not state.created(name):
        return None
    points = state.exact_points(name)
    return {
        **to_record(t),
        "exact_points": {str(b): v for b, v in sorted(points.items())},
        "latest_exact_barrier": max(points, default=None),
    }


def barriers(state: MetaState, start: int, limit: int) -> list[dict[str, Any]]:
    ids = sorted(b for b in state.barriers if b >= start)[:limit]
    return [to_record(state.barriers[b]) for b in ids]


def overview(state: MetaState, now_ms: int, liveness_ms: int, rejections: list[dict[str, Any]],
             since_ms: int | None = None, timeline: int = 30) -> dict[str, Any]:
    """What the live page (``/``) shows, in one body so one poll renders it: per table its kind,
    writer, freshness (now - its newest exact barrier's time), staleness a reader sees, lag, E2E
    delay and rows sent to its dead-letter table (over the barriers kept); per job its status,
    inputs and time per barrier; the bottleneck; per maintained table the source columns of each
    of its columns (``coordinator.columns``, from the root tables' DDL and the jobs' queries); the
    newest ``timeline`` barriers with how many tables committed each (of those that commit it: a
    strided table only its multiples); open leases; and this
    worker's recent command rejections. Delays and staleness count the barriers announced since
    ``since_ms`` (the worker's start: a pipeline stopped for an hour before is not this run's)."""
    report = delays(state, now_ms, liveness_ms, since_ms=since_ms)
    shape = topology(state, now_ms, liveness_ms)
    catalog = state.catalog()
    points = {t: state.exact_points(t) for t in catalog}
    tables: dict[str, Any] = {}
    for name in catalog:
        figures = report["tables"].get(name, {})
        latest = figures.get("latest_exact_barrier")
        announced = state.barriers.get(latest) if latest is not None else None
        kept = state.completions.get(name, {})
        tables[name] = {**shape["tables"][name], **figures,
                        "freshness_ms": now_ms - announced.ts_ms if announced is not None else None,
                        "dead_letters": sum(kept[b].rows_rejected for b in points[name])}
    jobs = {job_id: {**job, "own_p50_ms": report["jobs"].get(job_id, {}).get("own_p50_ms")}
            for job_id, job in shape["jobs"].items()}
    newest = sorted(state.barriers)[-timeline:]
    committed = {b: sum(1 for t in catalog if b in points[t]) for b in newest}
    due = {b: sum(1 for t in catalog if commits_at(state, t, b)) for b in newest}  # a strided table: its multiples
    return {
        "now_ms": now_ms,
        "tables": tables,
        "jobs": jobs,
        "edges": shape["edges"],
        "bottleneck": report["bottleneck"],
        "columns": column_sources(
            tuple((n, ddl_columns(t.schema)) for n, t in sorted(state.tables.items()) if t.schema),
            tuple(sorted((j.sink, j.sql) for j in state.active_jobs() if j.sql))),
        "barriers": [{"barrier": b, "ts_ms": state.barriers[b].ts_ms, "committed": committed[b], "of": due[b]}
                     for b in newest],
        "leases": [{k: v for k, v in to_record(lease).items() if k != "secret_digest"}  # the page needs no proof
                   for _, lease in sorted(state.leases.items())],
        "rejections": rejections,
    }


def delays(state: MetaState, now_ms: int, liveness_ms: int, last: int = 100, since_ms: int | None = None) -> dict[str, Any]:
    """Per table and job: latest exact barrier, lag, delay p50/p99 over the last barriers; the
    bottleneck; each job's status as ``topology`` shows it."""
    report = delay_report(state, last, since_ms)
    for job_id, job in report["jobs"].items():
        job["status"] = state.status_of(state.jobs[job_id], now_ms, liveness_ms)
    return report
