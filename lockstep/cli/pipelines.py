"""Running pipelines: ``run``, ``stop``, ``revise``, ``explain``."""

from __future__ import annotations

import getpass
import socket
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import click

from coordinator.client.commands import new_request_id
from coordinator.client.rest import get_json
from coordinator.domain import DeregisterJob, DropTable, RequestRevision
from coordinator.domain.errors import LockstepError, Rejected
from coordinator.domain.events import END_STATUSES, CutEntry, JobStatus, split_key
from coordinator.domain.starts import describe
from coordinator.settings import Settings
from lockstep.cli.common import echo_json, format_option, load, send, stop_signals


@click.command()
@click.argument("pipeline_files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--job", "jobs", multiple=True, help="Run only this job (job id or sink table); repeatable.")
@click.option("--max-restarts", type=click.IntRange(0), default=None,
              help="Give a failing job up after this many restarts and record it FAILED (default: never).")
@click.option("--master", default=None, metavar="URL",
              help="Spark master to run the jobs on, e.g. spark://127.0.0.1:7077 (default: LOCKSTEP_SPARK_MASTER, local[2]).")
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE", callback=lambda _c, _p, v: spark_confs(v),
              help="A Spark setting for the jobs' session, as spark-submit's --conf; repeatable.")
@click.option("--metrics-address", default=None, metavar="HOST:PORT",
              help="Serve the jobs' own per-barrier figures (Prometheus) at http://HOST:PORT/metrics, e.g. 127.0.0.1:9108.")
@click.pass_obj
def run(settings: Settings, pipeline_files: tuple[str, ...], jobs: tuple[str, ...], max_restarts: int | None,
        master: str | None, confs: dict[str, str], metrics_address: str | None) -> None:
    """Register the tables and jobs of PIPELINE_FILES with the coordinator, then run its jobs.

    A pipeline file is SQL, or Python with decorated functions (docs/pipelines.md); several files
    make one pipeline (a Python file's functions may read a SQL file's tables).

    Any rejection is printed and nothing starts. A root table reads its topics from where its
    'start' rule said when it was declared (default: earliest, each partition's first record).
    Each root job is its own streaming query with its own checkpoint under
    $LOCKSTEP_HOME/checkpoints/<prefix>/<table>-<table id> (a table of the same name in another
    pipeline, or one dropped before, is never continued; a warehouse folder holding such a
    table's data is refused, exit 1, with what to do); the jobs that read only tables of this
    run are its fused group: they run on those tables' commits, without a query of their own
    (`lockstep explain` lists the groups; LOCKSTEP_FUSE_JOBS=0: every job its own query). A job
    that fails is reported and restarted with a growing backoff while the others carry on (a
    member of a fused group then runs as its own query).
    With --master spark://HOST:PORT the jobs' Spark work runs on that cluster's executors (the
    driver, with the barrier source, the commits and the completions, stays in this process).

    A table made by CREATE TABLE AS SELECT appears (to readers and `lockstep topology`) once its
    first barrier is committed; if its job ends before that, the table and its files are removed.
    Running a pipeline again with a changed query is accepted: new barriers use it, and
    `lockstep revise TABLE --to-barrier B` recomputes the barriers after B with it.

    It says when each job committed its first barrier, and while a job is far behind (a restart
    after a while) how it catches up, and where its live page is. A job with a barrier ready for
    it whose table and Spark work stood still for LOCKSTEP_STUCK_AFTER_S (60 s) is restarted. With --metrics-address the jobs'
    own figures per barrier (time per phase, commits, restarts) are served for Prometheus.

    Ctrl-C or SIGTERM (kill PID, systemd, Kubernetes) stops it cleanly: no new barrier is offered,
    each job's barrier in progress commits (at most 20 s), then the jobs and Spark stop; a second
    signal stops at once. The jobs stay RUNNING for the coordinator: running the pipeline again
    continues them. Exit 0 once every job was stopped (`lockstep stop`), 1 if one ended FAILED
    (--max-restarts) or Spark's driver JVM exited under the jobs (it exits on a fatal error such
    as running out of memory; the message says so), 130 after Ctrl-C, 143 after SIGTERM.
    """
    from spark_jobs.ops.jobs import register_pipeline, select_jobs
    from spark_jobs.ops.renewals import Renewals
    from spark_jobs.ops.runner import STOP_DRAIN_S, Supervisor
    from spark_jobs.runtime.formats import check_sources
    from spark_jobs.runtime.job_metrics import serve
    from spark_jobs.runtime.session import build_session, driver_exit_code, jvm_exited_error, session_running, stop_session

    if metrics_address is not None:
        serve(metrics_address)  # first: a bad or busy address is said before anything starts

    pipeline = load(*pipeline_files)
    known = {j.job_id for j in pipeline.jobs} | {j.sink for j in pipeline.jobs}
    unknown = [j for j in jobs if j not in known]
    if unknown:
        raise click.UsageError(f"no job or table {', '.join(unknown)} in {', '.join(pipeline_files)}; "
                               f"known: {', '.join(sorted(known))}")
    check_sources(pipeline.roots, settings.schema_registry_url)  # e.g. a column its source cannot fill
    report = lambda message: click.echo(message, err=True)  # noqa: E731
    spark = None
    with stop_signals() as stopping, ExitStack() as cleanup:
        try:
            registered = register_pipeline(settings, pipeline)
        except Rejected as exc:
            raise Rejected(f"{exc}; nothing was started") from exc
        for table in sorted({t.name for t in pipeline.derived} - {t.name for t in registered.derived}):
            click.echo(f"table {table} exists already: its CREATE TABLE IF NOT EXISTS does nothing", err=True)
        # from now on, while Spark starts too: the leader must not take a pending table for abandoned
        renewals = Renewals(settings, [j.job_id for j in select_jobs(registered, jobs)], report).start()
        cleanup.callback(renewals.close)
        try:
            stopping.check()
            began, owned = time.monotonic(), not session_running()
            spark = build_session(f"lockstep-{Path(pipeline_files[0]).stem}", settings=settings, master=master, conf=confs)
            stopping.reclaim()
            if owned:  # not a session this process had already (a test's, a notebook's)
                cleanup.callback(stop_session, spark)
            click.echo(f"Spark session up in {time.monotonic() - began:.1f} s", err=True)
            stopping.check()
            supervisor = Supervisor(spark, registered, settings, jobs, report=report, follow_status=True,
                                    max_restarts=max_restarts, renewals=renewals)
            cleanup.callback(supervisor.stop, STOP_DRAIN_S)
            supervisor.start()
            click.echo(f"running {len(supervisor.queries)} job(s): {', '.join(supervisor.queries)} "
                       "(Ctrl-C or SIGTERM stops)")
            click.echo(f"live page: {settings.page_url}")
            if metrics_address is not None:
                click.echo(f"the jobs' metrics: http://{metrics_address}/metrics")
            supervisor.run(stopping.event)
            stopping.check()
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (Terminated): exit 130 or 143 once stopped
            click.echo(f"stopping: each job's barrier in progress commits first (at most {STOP_DRAIN_S:.0f} s) ...")
            raise
        except Exception as exc:  # every call into a JVM that exited fails: say that it exited, once
            if isinstance(exc, LockstepError) or spark is None or (code := driver_exit_code(spark, wait=5.0)) is None:
                raise
            raise jvm_exited_error(code) from exc
    failed = sorted(job for job, status in supervisor.ended.items() if status == JobStatus.FAILED)
    if failed:
        raise LockstepError(f"job(s) {', '.join(failed)} ended FAILED (the messages above say why); "
                            "`lockstep delays` shows every job's status")
    click.echo("every job ended (lockstep stop); exiting")


def spark_confs(pairs: tuple[str, ...]) -> dict[str, str]:
    """``("spark.executor.memory=1g", ...)`` as a dict; a pair without ``=`` is a usage error.

    >>> spark_confs(("spark.executor.memory=1g", "spark.x=a=b"))
    {'spark.executor.memory': '1g', 'spark.x': 'a=b'}
    """
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE (e.g. --conf spark.executor.memory=1g)", param_hint="--conf")
        out[key.strip()] = value
    return out


@click.command("stop")
@click.argument("job")
@click.option("--cancel", is_flag=True, help="Stop at once (CANCELED) instead of after the barrier in progress (FINISHED).")
@click.option("--reason", default=None, help="Why, recorded with the status (default: who stopped it and when).")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the coordinator's outcome.")
@click.pass_obj
def stop_job(settings: Settings, job: str, cancel: bool, reason: str | None, timeout: float) -> None:
    """End a running job. JOB is a job id or the table it writes.

    The coordinator records the job FINISHED (or CANCELED with --cancel); the `lockstep run`
    process running it stops it within about a second (FINISHED: once the barrier in progress
    is committed) and does not restart it. The job no longer holds barriers back, `lockstep
    delays` and the lineage tables show its status, and its table keeps the exact points it
    has. Running the pipeline again (`lockstep run`) continues the table from its newest
    exact point.

    Exit 0 recorded, 1 rejected (unknown job, already ended), 3 coordinator unreachable.
    """
    topology_now = get_json(settings, "/topology")
    if job not in topology_now["jobs"]:  # a table: its running writer (a CTAS table may still be pending)
        job = next((j for j, v in topology_now["jobs"].items() if v["sink"] == job and v["status"] not in END_STATUSES), job)
    status = JobStatus.CANCELED if cancel else JobStatus.FINISHED
    if reason is None:
        reason = f"lockstep stop by {_who()}"
    send(settings, DeregisterJob(new_request_id(), job, status, reason), timeout)
    click.echo(f"job {job} recorded {status}; the process running it stops it "
               + ("now" if cancel else "after the barrier in progress"))


@click.command("revise")
@click.argument("table")
@click.option("--to-barrier", "barrier", type=click.IntRange(0), default=None,
              help="Keep the exact points up to this barrier; recompute everything after it.")
@click.option("--full", is_flag=True, help="Empty the tables and recompute them from the start of their input.")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the coordinator's outcome.")
@click.pass_obj
def revise(settings: Settings, table: str, barrier: int | None, full: bool, timeout: float) -> None:
    """Recompute TABLE and every table downstream of it from a barrier, while the pipeline runs.

    Use it when a table's data went wrong: after fixing a job's query (edit the pipeline file and
    run `lockstep run` again), or to re-ingest a root table from its Kafka topic. Each table in
    the closure gets a new generation: its exact points after the barrier stop counting at once
    (consistent reads fall back to the barrier), a root table is put back to its exact point at
    the barrier and re-reads its topic from that barrier's cut, derived tables are recomputed
    from their sources; the jobs running them switch over by themselves. Tables outside the
    closure are not touched.

    Exit 0 accepted, 1 rejected (unknown table, no exact point at that barrier), 3 unreachable.
    """
    if (barrier is None) == (not full):
        raise click.UsageError("give --to-barrier B or --full (one of them)")
    outcome = send(settings, RequestRevision(new_request_id(), table, 0 if full else barrier, full), timeout)
    closure = [ident for kind, ident in map(split_key, outcome.keys) if kind == "table"]
    start = "from scratch" if full else f"from barrier {barrier}"
    click.echo(f"revising {', '.join(closure)} {start}; their running jobs switch to the new generation")


@click.command("drop")
@click.argument("table")
@click.option("--reason", default=None, help="Why, for the record (default: who dropped it and when).")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the coordinator's outcome.")
@click.pass_obj
def drop(settings: Settings, table: str, reason: str | None, timeout: float) -> None:
    """Remove TABLE: its catalog entry, its exact points and its files (the Delta table, its dead
    letters, and the checkpoints of its jobs on this machine, so a table of that name starts afresh).

    Refused while a job writes or reads it (`lockstep stop` them first) or a repeatable-read
    snapshot holds it. Exit 0 dropped, 1 rejected, 3 coordinator unreachable.
    """
    from spark_jobs.ops.tables import remove_table
    from spark_jobs.runtime.session import build_session
    from spark_jobs.runtime.storage import Storage

    writers = [job for job, j in get_json(settings, "/topology")["jobs"].items() if j["sink"] == table]
    send(settings, DropTable(new_request_id(), table, reason or f"lockstep drop by {_who()}"), timeout)
    # the files go through Hadoop's file system API (an s3a:// warehouse too), so Spark starts here
    removed = remove_table(Storage(build_session("lockstep-drop", settings=settings)), settings, table, writers)
    click.echo(f"table {table} dropped; removed {', '.join(str(p) for p in removed) or 'no files (there were none)'}")


def _started(settings: Settings, roots: list[str]) -> dict[str, str]:
    """Where the coordinator, if one answers, says each of ``roots`` started reading (its start
    rule and the offsets that resolved to); nothing for a table it does not know yet."""
    try:
        known = get_json(settings, "/topology", timeout=2)["tables"]
    except (LockstepError, KeyError, TypeError):  # none answers, or not a coordinator: the rules say enough
        return {}
    return {name: describe(known[name]["start"], [CutEntry(*c) for c in known[name].get("start_offsets", [])])
            for name in roots if "start" in known.get(name, {})}


def _who() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()} at {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC"


@click.command()
@click.argument("pipeline_files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@format_option()
@click.pass_obj
def explain(settings: Settings, pipeline_files: tuple[str, ...], fmt: str) -> None:
    """Print, per job of PIPELINE_FILES, how it maintains its table and why, which source columns
    each of its columns is computed from, and the fused groups `lockstep run` of those files
    makes (parses SQL and loads Python files without calling their functions; starts no Spark,
    reaches no broker). If a coordinator answers at LOCKSTEP_COORDINATOR_URL, it also says where
    each root table it knows started reading (its 'start' rule resolved to offsets)."""
    from spark_jobs.planning.columns import column_lineage
    from spark_jobs.planning.fusion import fused_groups
    from spark_jobs.planning.pipeline import DerivedTable
    from spark_jobs.planning.plans import explain_job

    pipeline = load(*pipeline_files)
    columns = column_lineage(pipeline)
    groups = fused_groups(pipeline.jobs) if settings.fuse_jobs else {}
    group_of = {member: leader for leader, members in groups.items() for member in members}
    started = _started(settings, [t.name for t in pipeline.roots])
    if fmt == "json":
        echo_json({"jobs": [{"job_id": job.job_id, "sink": job.sink, "sources": list(job.sources),
                             "topics": list(job.external_topics), "maintenance": explain_job(pipeline, job),
                             "columns": columns.get(job.sink), "fused_with": group_of.get(job.job_id),
                             "started_at": started.get(job.sink)}
                            for job in pipeline.jobs],
                   "fused_groups": {leader: list(members) for leader, members in groups.items()}})
        return
    for job in pipeline.jobs:
        click.echo(f"{job.job_id} -> {job.sink}: {explain_job(pipeline, job)}")
        if job.sink in started:
            click.echo(f"    started reading at {started[job.sink]} (the coordinator at {settings.coordinator_url})")
        table = pipeline.table(job.sink)
        python = table.python if isinstance(table, DerivedTable) else None
        if python is not None:
            comment = f": {python.comment}" if python.comment else ""
            click.echo(f"    columns: those {python.function.__name__} returns ({python.origin}){comment}")
        elif job.sources and columns.get(job.sink) is None:
            click.echo("    columns: unknown (it reads a table these files do not declare)")
        for column, sources in (columns.get(job.sink) or {}).items():
            click.echo(f"    {column} <- {', '.join(sources) or '(no source column)'}")
    for leader, members in groups.items():
        click.echo(f"fused group of {leader}: {', '.join(members)} run on its commits in the same `lockstep run`, "
                   "without a streaming query of their own (LOCKSTEP_FUSE_JOBS=0: each its own query)")
