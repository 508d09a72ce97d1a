"""Barrier-delimited micro-batches: a Python streaming data source whose offsets are barrier ids.

``latestOffset`` returns the newest barrier the job may process (for a root job: the newest
announced; for an intermediate job: the newest exact point of all its sources), so every
micro-batch covers whole barriers ``(start, end]`` and never splits one. Each row of a batch
is one barrier with what the job needs to process it (cuts, or source versions); the job's
``foreachBatch`` then commits one Delta version per barrier and publishes a completion.

An offset also names the job's generation: when a revision bumps it, the next micro-batch
starts over from the revision's barrier in the new generation (the running query follows;
nothing restarts it). A revised root job's first barrier carries ``restore_to``.

The reader runs in Spark's Python source runner, a separate process: it folds the state
topics itself with the same StateReader as every other component.

Example::

    spark.dataSource.register(BarrierSource)
    barriers = (spark.readStream.format("lockstep_barriers")
                .option("job_id", "ingest_shopping").options(**settings_options(settings)).load())
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from coordinator.domain import JobState, MetaState
from coordinator.domain.barriers import BarrierConfig, commit_points
from coordinator.domain.events import END_STATUSES
from coordinator.settings import Settings

SCHEMA = "barrier BIGINT, generation BIGINT, ts_ms BIGINT, info STRING"


def settings_options(settings: Settings) -> dict[str, str]:
    """What the source runner process needs to reach the state topics."""
    return {
        "catchup_stride": os.environ.get("LOCKSTEP_BARRIER_CATCHUP_STRIDE", str(BarrierConfig.catchup_stride)),
        "bootstrap": settings.bootstrap,
        "topic_prefix": settings.topic_prefix,
        "kafka_client": json.dumps(dict(settings.kafka_client)),
    }


@dataclass(frozen=True)
class BarrierWork:
    """One barrier for one job: the unit a job commits."""

    barrier: int
    generation: int
    ts_ms: int
    # root jobs: per topic-partition [start, end) offsets; start -2 means "earliest"
    offsets: list[tuple[str, int, int, int]] = field(default_factory=list)
    # intermediate jobs: source table -> Delta version at this barrier
    source_versions: dict[str, int] = field(default_factory=dict)
    # the first barrier of a revised root job: first put its table back to its state at the
    # revision's barrier, (barrier, version), where version EMPTY means no rows (--full)
    restore_to: tuple[int, int] | None = None

    def to_json(self) -> str:
        return json.dumps({"offsets": self.offsets, "source_versions": self.source_versions,
                           "restore_to": self.restore_to})

    @classmethod
    def from_row(cls, row: Any) -> BarrierWork:
        info = json.loads(row["info"])
        return cls(row["barrier"], row["generation"], row["ts_ms"],
                   [tuple(o) for o in info["offsets"]], info["source_versions"],
                   tuple(info["restore_to"]) if info.get("restore_to") else None)


EMPTY = -1  # restore_to for a revision from scratch (--full)


def ready_barrier(state: MetaState, job: JobState) -> int:
    """The newest barrier ``job`` may process now."""
    if job.external_topics:
        return state.last_barrier()
    return state.common_barrier(job.sources) or 0


def work_for(state: MetaState, job: JobState, start: int, end: int, stride: int = 10) -> list[BarrierWork]:
    """The barriers in ``(start, end]`` that ``job`` commits, with what it needs for each. A job
    more than ``stride`` barriers behind folds them into commits at multiples of ``stride``; a
    root job then reads from the cut of the barrier it processed before."""
    out = []
    previous = start
    points = {s: state.exact_points(s) for s in job.sources}  # empty for root jobs
    restore = _restore_point(state, job) if job.external_topics and start == job.resume_barrier else None
    for b in commit_points(start, end, stride):
        announced = state.barriers.get(b)
        if announced is None or not all(b in p for p in points.values()):
            continue
        work = BarrierWork(b, job.generation, announced.ts_ms)
        if job.external_topics:
            first = previous <= job.resume_barrier and not state.completions.get(job.sink, {}).get(previous)
            ends = {(c.topic, c.partition): c.offset for c in announced.cut if c.topic in job.external_topics}
            before = {} if first else _cut_before(state, previous, set(ends))
            offsets = [(t, p, before.get((t, p), -2), end) for (t, p), end in ends.items()]
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


def _cut_before(state: MetaState, barrier: int, needed: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Where each needed topic-partition stood at ``barrier``: its offset in the newest cut at or
    before it that has the partition (a cut taken before a topic was read lacks it)."""
    where: dict[tuple[str, int], int] = {}
    for b in range(barrier, 0, -1):
        if needed <= where.keys():
            break
        for c in state.barriers[b].cut if b in state.barriers else ():
            where.setdefault((c.topic, c.partition), c.offset)
    return where


def register_barrier_source(spark: Any) -> None:
    """Register ``lockstep_barriers`` once per Spark application (registration is global)."""
    from pyspark.errors import AnalysisException

    try:
        spark.dataSource.register(BarrierSource)
    except AnalysisException as exc:
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise


class BarrierSource(DataSource):
    """``spark.readStream.format("lockstep_barriers").option("job_id", ...)``."""

    @classmethod
    def name(cls) -> str:
        return "lockstep_barriers"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802 - pyspark API
        return BarrierReader(dict(self.options))


class BarrierReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.job_id = options["job_id"]
        self.options = options
        self._reader: Any = None
        self._latest: dict[str, int] | None = None

    def _state(self) -> MetaState:
        if self._reader is None:
            from coordinator.stream.follower import StateReader
            from coordinator.stream.topics import Topics

            settings = Settings(
                bootstrap=self.options["bootstrap"],
                topic_prefix=self.options["topic_prefix"],
                kafka_client=json.loads(self.options.get("kafka_client", "{}")),
            )
            self._reader = StateReader(settings, Topics(settings.topic_prefix))
        return self._reader.read_to_end(timeout=60)

    def _job(self, state: MetaState) -> JobState:
        job = state.jobs.get(self.job_id)
        if job is None:
            raise RuntimeError(f"job {self.job_id!r} is not registered with the coordinator (run `lockstep run` first)")
        return job

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 - pyspark API
        job = self._job(self._state())
        return {"barrier": job.resume_barrier, "generation": job.generation}

    def latestOffset(self) -> dict[str, int]:  # noqa: N802 - pyspark API
        state = self._state()
        job = self._job(state)
        if job.status in END_STATUSES and self._latest is not None:
            return self._latest  # stopped (`lockstep stop`): no barrier after the one in progress
        self._latest = {"barrier": max(job.resume_barrier, ready_barrier(state, job)), "generation": job.generation}
        return self._latest

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        state = self._state()
        job = self._job(state)
        first = start["barrier"]
        if start.get("generation", 0) != end.get("generation", 0):
            first = job.resume_barrier  # revised: start over from the revision's barrier
        work = []
        if end.get("generation", 0) == job.generation:  # else revised again meanwhile: the next batch
            work = work_for(state, job, first, end["barrier"], int(self.options.get("catchup_stride", 10)))
        rows = [(w.barrier, w.generation, w.ts_ms, w.to_json()) for w in work]
        return [InputPartition(json.dumps(rows))]

    def read(self, partition: InputPartition) -> Iterator[tuple[int, int, int, str]]:
        for row in json.loads(partition.value):
            yield tuple(row)  # type: ignore[misc]

    def commit(self, end: dict[str, int]) -> None:
        pass
