"""Nexmark's queries (pipelines/nexmark.sql), each maintained barrier after barrier, against a
full refresh of the same query in the same run (a query kept in several tables, such as q9 and
q4, refreshed as one query: the tables it reads inlined, not written), over Delta tables of
people, auctions and bids made by Spark (no Kafka: this measures maintenance, not
ingestion). Every barrier appends Nexmark's mix of new events (per 50: 1 person, 3 auctions,
46 bids; bids on recent auctions by recent people, log-uniform prices).

Prints, per query, the median time per barrier of each path, the ratio, the events per second
the incremental path keeps up with, where its time went, and at how many barriers the
incremental job recomputed (a keyed table: rewrote its table rather than MERGE) because that
had cost less (``spark_jobs.runtime.costs``); the first barrier of each (a keyed table's
bootstrap: its state built from all the events), and of each table with a state in Spark's
state store (a keyed table, a reader of a changelog table) its size on disk and the first
barrier after a restart (its queries started again on their checkpoints); of each table in the
changelog layout, what a read without Spark costs against the same rows in place.

Usage: python -m bench.nexmark [--events 1000000] [--per-barrier 50000] [--rounds 3] [--queries q3,q9]
                               [--compact-after 100]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench.results import Figures, add_json_flag
from bench.spark_jobs import phases, way
from bench.stack import local_stack

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from spark_jobs.planning.pipeline import Pipeline

PIPELINE = Path(__file__).parents[1] / "pipelines" / "nexmark.sql"
FIRST_ID = 1000
QUERIES = "q1,q3,q4,q5,q7,q8,q9,q16,q17,q18,q19,q20"
BASE_MS = 1_790_000_000_000  # event i happens at BASE_MS + i (a thousand events a second)


def _div(column: Column, by: int) -> Column:
    """Whole division (a Column has no ``//``)."""
    from pyspark.sql import functions as F

    return F.floor(column / by).cast("long")


def events(spark: SparkSession, start: int, count: int) -> dict[str, DataFrame]:
    """Nexmark events ``start .. start + count`` (a multiple of 50) as rows of each table."""
    from pyspark.sql import functions as F

    def ids(per_50: int) -> DataFrame:  # the kind's ids made by these events, with their event's number
        first = start // 50 * per_50
        return spark.range(first, first + count // 50 * per_50).select(
            (F.col("id") + FIRST_ID).alias("id"), _div(F.col("id") * 50, per_50).alias("event"))

    def recent(made: F.Column) -> F.Column:  # mostly among the newest 100, as in Nexmark's hot items
        back = F.when(F.rand() < 0.9, F.floor(F.rand() * F.least(made, F.lit(100)))).otherwise(F.floor(F.rand() * made))
        return (F.lit(FIRST_ID) + made - 1 - back).cast("long")

    def at(event: F.Column) -> F.Column:
        return F.timestamp_millis(F.lit(BASE_MS) + event)

    person = ids(1).select("id", F.concat(F.lit("person"), "id").alias("name"), F.lit("").alias("email_address"),
                           F.lit("").alias("credit_card"), F.element_at(F.array(*map(F.lit, ("Boise", "Bend", "Kent"))),
                                                                        (F.col("id") % 3 + 1).cast("int")).alias("city"),
                           F.element_at(F.array(*map(F.lit, ("OR", "ID", "CA", "WA"))),
                                        (F.col("id") % 4 + 1).cast("int")).alias("state"),
                           at(F.col("event")).alias("date_time"), F.lit("").alias("extra"))
    auction = ids(3).select("id", F.concat(F.lit("item"), "id").alias("item_name"), F.lit("").alias("description"),
                            F.lit(100).cast("long").alias("initial_bid"), F.lit(200).cast("long").alias("reserve"),
                            at(F.col("event")).alias("date_time"),
                            at(F.col("event") + 2000 + F.floor(F.rand() * 18000)).alias("expires"),
                            recent(_div(F.col("event"), 50) + 1).alias("seller"), (F.col("id") % 5 + 10).alias("category"),
                            F.lit("").alias("extra"))
    channel = F.floor(F.rand() * 6).cast("int")
    bid = ids(46).select(recent((_div(F.col("event"), 50) + 1) * 3).alias("auction"),
                         recent(_div(F.col("event"), 50) + 1).alias("bidder"),
                         F.round(F.pow(F.lit(10.0), F.rand() * 6) * 100).cast("long").alias("price"),
                         F.element_at(F.array(*map(F.lit, ("Apple", "Google", "Facebook", "Baidu", "channel-5",
                                                            "channel-6"))), channel + 1).alias("channel"),
                         F.concat(F.lit("https://www.nexmark.com/a/b/c/item.htm?query=1&channel_id="), channel).alias("url"),
                         at(F.col("event")).alias("date_time"), F.lit("").alias("extra"))
    return {"person": person, "auction": auction, "bid": bid}


def _chain(pipeline: Pipeline, name: str) -> list[str]:
    """The derived tables ``name`` reads, directly or not, then ``name``: in pipeline order."""
    order = [t.name for t in pipeline.derived]
    needed = {name}
    for table in reversed(order):
        if table in needed:
            needed |= set(pipeline.table(table).sources)
    return [t for t in order if t in needed]


def _inlined(pipeline: Pipeline, chain: list[str]) -> tuple[str, tuple[str, ...]]:
    """The last table of ``chain`` as one query, the tables it reads as its CTEs (a full
    refresh writes no table between), and the root tables it reads."""
    queries = {t: pipeline.table(t).query for t in chain}  # type: ignore[union-attr]
    inlined = queries.pop(chain[-1])
    if queries:
        inlined = f"WITH {', '.join(f'{t} AS ({q})' for t, q in queries.items())} {inlined}"
    roots = {s for t in chain for s in pipeline.table(t).sources if s not in chain}
    return inlined, tuple(sorted(roots))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="events before the first barrier (default 1,000,000)")
    parser.add_argument("--per-barrier", type=int, default=50_000, help="new events per barrier (default 50,000)")
    parser.add_argument("--rounds", type=int, default=3, help="barriers measured (default 3)")
    parser.add_argument("--queries", default=QUERIES, help=f"queries of pipelines/nexmark.sql to run (default: {QUERIES})")
    parser.add_argument("--compact-after", type=int, metavar="N",
                        help="a changelog table's appends between two compactions (default: the job's, 100)")
    add_json_flag(parser)
    args = parser.parse_args()
    if args.compact_after is not None:
        if args.compact_after < 1:
            parser.error("--compact-after must be 1 or more")
        from spark_jobs.runtime import costs
        costs.COMPACT_APPENDS = args.compact_after
    if args.events % 50 or args.per_barrier % 50 or args.per_barrier <= 0:
        parser.error("--events and --per-barrier must be multiples of 50 (Nexmark's mix), --per-barrier above 0")
    figures = Figures("nexmark", args)
    run(args.events, args.per_barrier, args.rounds, args.queries.split(","), figures)
    figures.write()


def run(initial: int, per_barrier: int, rounds: int, names: list[str], figures: Figures) -> None:
    from coordinator.domain.work import BarrierWork
    from spark_jobs.planning.pipeline import parse_pipeline
    from spark_jobs.planning.plan import Plan, PlanKind
    from spark_jobs.planning.plans import plan_for
    from spark_jobs.runtime.commits import CompletionPublisher, DeltaSink
    from spark_jobs.runtime.ivm import TableMaintainer
    from spark_jobs.runtime.maintenance.state_stream import STATE_FOLDER
    from spark_jobs.runtime.session import build_session
    from spark_jobs.runtime.storage import Storage

    pipeline = parse_pipeline(PIPELINE.read_text())
    tables = {t.name: t for t in pipeline.derived}
    unknown = [n for n in names if n not in tables]
    if unknown:
        raise SystemExit(f"no such query in {PIPELINE.name}: {', '.join(unknown)} (it has {', '.join(tables)})")
    with local_stack() as settings:
        spark = build_session("bench-nexmark", settings=settings, conf={"spark.driver.memory": "6g"})
        roots = {t.name: DeltaSink(spark, settings.table_location(t.name), f"ingest_{t.name}", t.schema_ddl)
                 for t in pipeline.roots}
        versions: dict[str, int] = {}

        def append(barrier: int, start: int, count: int) -> None:
            for name, frame in events(spark, start, count).items():
                versions[name] = roots[name].commit(barrier, 0, lambda f=frame, n=name: f.write.format("delta")
                                                    .mode("append").save(roots[n].path))

        t0 = time.perf_counter()
        append(1, 0, initial)
        print(f"{initial:,} events written in {time.perf_counter() - t0:.1f}s; then {per_barrier:,} per barrier")
        publisher = CompletionPublisher(settings)
        suffix = {"incremental": "inc", "full refresh": "full"}
        chains = {name: _chain(pipeline, name) for name in names}
        plans = {t: plan_for(pipeline, tables[t]) for chain in chains.values() for t in chain}
        jobs: dict[tuple[str, str], TableMaintainer] = {}  # (table, how), each table after those it reads

        def maintainer(table: str, how: str, plan: Plan) -> TableMaintainer:
            return TableMaintainer(spark, tables[table], plan, f"maintain_{table}_{suffix[how]}",
                                   lambda t, s=suffix[how]: settings.table_location(f"{t}_{s}" if t in tables else t),
                                   publisher)

        for name in names:
            print(f"{name}: {plans[name].explain()[:160]}")
            for table in chains[name]:
                plan = plans[table]
                if (table, "incremental") not in jobs:
                    jobs[(table, "incremental")] = maintainer(table, "incremental", plan if plan.incremental else Plan(
                        PlanKind.FULL_REFRESH, "not incremental", plan.query, sources=plan.sources))
            query, roots_read = _inlined(pipeline, chains[name])
            jobs[(name, "full refresh")] = maintainer(name, "full refresh", Plan(
                PlanKind.FULL_REFRESH, "the baseline", query, sources=roots_read))
        made: dict[str, dict[str, int]] = {how: {} for how in suffix}  # each way's derived tables' versions

        def process(key: tuple[str, str], barrier: int) -> float:
            job, t0 = jobs[key], time.perf_counter()
            job.process(BarrierWork(barrier, 0, 0, source_versions={
                s: made[key[1]][s] if s in tables else versions[s] for s in job.plan.sources}))
            made[key[1]][key[0]] = job.sink.versions[(0, barrier)]
            return time.perf_counter() - t0

        for key in jobs:  # a keyed table builds its state here: its bootstrap
            first = process(key, 1)
            print(f"barrier 1 {key[0]:>4} {key[1]:<12} {first:6.2f}s (the first: made from all the events)")
            figures.add("first barrier", first, "s", table=key[0], how=key[1], events=initial)
        spent: dict[tuple[str, str], float] = {}
        spans: dict[tuple[str, str, str], list[float]] = {}  # (table, how, phase): its ms at each barrier
        times: dict[tuple[str, str], list[float]] = {(n, h): [] for n in names for h in suffix}
        recomputed = dict.fromkeys(names, 0)  # barriers where the incremental job chose to recompute
        for b in range(2, rounds + 2):
            append(b, initial + (b - 2) * per_barrier, per_barrier)
            for key, job in jobs.items():
                spent[key] = process(key, b)
                print(f"barrier {b} {key[0]:>4} {key[1]:<12} {spent[key]:6.2f}s ({phases(job)}{way(job)})")
                for phase in job.watch.phases():
                    spans.setdefault((*key, phase.name), []).append(phase.ms)
            for name, how in times:  # a query's time: kept, its table's and the tables it reads'; else its one query's
                times[(name, how)].append(sum(spent[(t, how)] for t in chains[name]) if how == "incremental"
                                          else spent[(name, how)])
                recomputed[name] += how == "incremental" and any(way(jobs[(t, how)]) for t in chains[name])
        print(f"\n{'query':<6} {'incremental':>12} {'full refresh':>13} {'full/inc':>9} {'events/s kept up':>17}")
        for name in names:
            full = statistics.median(times[(name, "full refresh")])
            context = {"query": name, "events": initial, "per_barrier": per_barrier}
            figures.add_median("full refresh per barrier", times[(name, "full refresh")], "s", **context)
            if not any(plans[t].incremental for t in chains[name]):  # (else the tables it reads are kept)
                print(f"{name:<6} {'-':>12} {full:12.2f}s {'-':>9} {per_barrier / full:17,.0f}  (full refresh only)")
                figures.add("events/s kept up", per_barrier / full, "events/s", how="full refresh", **context)
                continue
            inc = statistics.median(times[(name, "incremental")])
            figures.add_median("incremental per barrier", times[(name, "incremental")], "s", baseline=full,
                               recomputed=recomputed[name], **context)
            figures.add("events/s kept up", per_barrier / inc, "events/s", how="incremental", **context)
            how = "its table compacted" if plans[name].changelog else \
                "its table rewritten, not MERGEd," if plans[name].keyed else "recomputed"
            chose = f"  ({how} at {recomputed[name]} of {rounds}{'' if plans[name].changelog else ': cheaper'})" \
                if recomputed[name] else ""
            print(f"{name:<6} {inc:11.2f}s {full:12.2f}s {full / inc:8.1f}x {per_barrier / inc:17,.0f}{chose}")
        for (table, how, phase), ms in spans.items():
            figures.add_median(f"{phase} per barrier", ms, "ms", table=table, how=how, events=initial)
        for name in names:
            if plans[name].changelog:
                read_costs(name, {how: (jobs[(name, how)].sink.path, made[how][name]) for how in suffix}, figures)
        stateful = {key: job for key, job in jobs.items() if job.keyed is not None or job.changelogs}
        if stateful:  # a restart: the queries stopped, the next barrier starts them again on their checkpoints
            append(rounds + 2, initial + rounds * per_barrier, per_barrier)
        for key, job in stateful.items():
            home = f"{job.sink.path}/{STATE_FOLDER}"
            size = sum(f.size for f in Storage(spark).files(home))
            print(f"{key[0]}: its state holds {size / 1e6:,.1f} MB on disk ({home})")
            figures.add("state on disk", size / 1e6, "MB", table=key[0], events=initial)
            job.stop_streams()
            restart = process(key, rounds + 2)
            print(f"{key[0]}: the first barrier after a restart took {restart:.2f}s ({phases(job)})")
            figures.add("first barrier after a restart", restart, "s", table=key[0], events=initial,
                        phases_ms={p.name: p.ms for p in job.watch.phases()})
        spark.stop()


def read_costs(name: str, tables: dict[str, tuple[str, int]], figures: Figures, reads: int = 5) -> None:
    """Time reads without Spark (``lockstep_reads``: delta-rs and DataFusion) of a changelog
    table (each key's newest row found at read time) against the same rows in place (the full
    refresh's table): a scan, and the rows of one auction. Median of ``reads`` each."""
    from deltalake import DeltaTable

    from lockstep_reads.engine import run_query

    summed = {"q17": "total_bids"}.get(name, "price")  # (columns of each changelog table of nexmark.sql)
    auction = {"q9": "id"}.get(name, "auction")
    sqls = {"COUNT(*)": f"SELECT COUNT(*) AS n, SUM({summed}) AS total FROM {name}",
            "one auction": f"SELECT * FROM {name} WHERE {auction} = {FIRST_ID + 7}"}
    for what, sql in sqls.items():
        took: dict[str, list[float]] = {}
        answers = set()
        for how, (path, version) in tables.items():
            for _ in range(reads):
                t0 = time.perf_counter()
                rows = run_query(sql, {name: DeltaTable(path, version=version)}).to_pylist()
                took.setdefault(how, []).append(time.perf_counter() - t0)
            answers.add(str(sorted(map(str, rows))))
        changelog, in_place = (statistics.median(took[h]) for h in ("incremental", "full refresh"))
        same = "the same rows" if len(answers) == 1 else "DIFFERENT ROWS"
        print(f"{name}: a read without Spark ({what}): changelog {changelog * 1000:.0f} ms, in place (the full "
              f"refresh's table) {in_place * 1000:.0f} ms, {changelog / in_place:.1f}x; {same}")
        figures.add(f"read without Spark ({what})", changelog * 1000, "ms", baseline=in_place * 1000,
                    ratio=changelog / in_place, samples=[t * 1000 for t in took["incremental"]], query=name,
                    same_rows=len(answers) == 1)


if __name__ == "__main__":
    main()
