"""The Faust app: the coordinator worker (``lockstep worker``).

Agents and timers only schedule the Coordinator's work: the commands agent decodes and
decides, the barrier clock and lease expiry run on the Faust leader only (and write through
one transactional id, so a paused leader that resumes is fenced: ``coordinator.stream.fencing``),
and the web views serve the folded state. ``create_app(settings)`` builds it; importing this module reads no
environment and touches no disk.

Example::

    create_app(Settings.from_env()).main()   # what `lockstep worker` runs
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import NoReturn, TypeVar

import faust
from faust.auth import Credentials, SASLCredentials, SSLCredentials
from faust.web import Request, Response, View
from prometheus_client import CONTENT_TYPE_LATEST
from tenacity import AsyncRetrying, RetryCallState, RetryError, retry_if_exception_type, stop_after_delay, wait_exponential

from coordinator.client.clock import now_ms
from coordinator.client.topics import Topics, ensure_topics
from coordinator.domain.errors import ExitCode, Rejected
from coordinator.domain.snapshot import ReadLevel, resolve_snapshot
from coordinator.settings import KafkaSecurity, Settings
from coordinator.stream import views
from coordinator.stream.coordinator import TICK_MS, Coordinator
from coordinator.stream.metrics import exposition

log = logging.getLogger(__name__)
T = TypeVar("T")
PRUNE_S = 5.0  # how often the leader forgets records below the retention floor
BACKOFF = wait_exponential(multiplier=0.5, max=30)  # 0.5 s, 1 s, 2 s ... at most 30 s between tries
OVERVIEW_TTL_S = 0.9  # the page polls every second: each open page reuses the same body within it
COMMAND_TRIES_S = 300.0  # a command still failing after this is skipped (its sender timed out long ago)


class LockstepApp(faust.App):
    """A Faust app that creates the coordinator's topics (with their configs) before its agents subscribe."""

    def __init__(self, settings: Settings, topics: Topics, **options: object) -> None:
        super().__init__(f"{settings.topic_prefix}-coordinator", **options)
        self.lockstep_settings = settings
        self.lockstep_topics = topics

    async def on_first_start(self) -> None:
        loop = asyncio.get_running_loop()
        created = await loop.run_in_executor(None, ensure_topics, self.lockstep_settings, self.lockstep_topics)
        if created:
            log.info("created topics: %s", ", ".join(created))
        await super().on_first_start()


class LockstepWorker(faust.Worker):
    """Faust's worker, exiting 130 after Ctrl-C (SIGINT) as every Lockstep command does (Faust
    exits 0): a shell or supervisor can tell an interrupted worker from one that ended."""

    interrupted = False

    def _on_sigint(self) -> None:
        self.interrupted = True
        super()._on_sigint()

    def execute_from_commandline(self) -> NoReturn:
        try:
            super().execute_from_commandline()
        except SystemExit as exc:
            if self.interrupted and exc.code in (0, None):
                raise SystemExit(ExitCode.INTERRUPTED) from None
            raise


def broker_credentials(security: KafkaSecurity) -> Credentials | None:
    """The worker's aiokafka clients authenticate as ``LOCKSTEP_KAFKA_*`` says, like every other client."""
    context = ssl.create_default_context(cafile=security.ca_location) if security.tls else None
    if security.sasl:
        return SASLCredentials(username=security.username, password=security.password, ssl_context=context,
                               mechanism=security.mechanism)
    return SSLCredentials(context) if context is not None else None


def create_app(settings: Settings) -> LockstepApp:
    """The coordinator worker for ``settings``: its agents, leader timers and REST views."""
    topics = Topics(settings.topic_prefix)
    datadir = (settings.home / "coordinator" / str(settings.coordinator_port)).absolute()
    datadir.mkdir(parents=True, exist_ok=True)
    app = LockstepApp(
        settings,
        topics,
        broker=[f"kafka://{hp}" for hp in settings.bootstrap.split(",")],
        broker_credentials=broker_credentials(settings.kafka_security),
        store="memory://",
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=1,
        topic_replication_factor=settings.replication_factor,
        web_host=settings.coordinator_host,
        web_bind=settings.coordinator_host,  # listen on the URL's host only (Faust binds 0.0.0.0 by default)
        web_port=settings.coordinator_port,
        broker_session_timeout=10.0,
        broker_heartbeat_interval=2.0,
        datadir=str(datadir),
        Worker=LockstepWorker,
    )
    commands_topic = app.topic(topics.commands, key_type=bytes, value_type=bytes)
    ready = asyncio.Event()
    started: list[Coordinator] = []  # the Coordinator, once its state is folded

    def coordinator() -> Coordinator:
        assert started, "coordinator not started"
        return started[0]

    @app.task
    async def _start() -> None:
        c = Coordinator(settings, topics)
        await asyncio.get_running_loop().run_in_executor(None, c.start)
        log.info("state folded: %d events, hash %s", c.follower.reader.stats.events_folded, c.state.state_hash())
        started.append(c)
        ready.set()

    async def guarded(what: str, work: Callable[[], T], leader_only: bool) -> T | None:
        """Run ``work`` off the event loop; if it raises (the broker is gone, a write timed out),
        log it, count it (/metrics lockstep_work_failures_total) and try again after a growing
        pause while this worker may still do it (a timer's work: while it leads; a command's: for
        ``COMMAND_TRIES_S``), so an outage never ends the worker. Faust's timers and agents would
        die on the first exception."""
        loop = asyncio.get_running_loop()

        def failed(retry: RetryCallState) -> None:
            coordinator().counters.work_failures += 1
            error = retry.outcome.exception() if retry.outcome is not None else None
            log.warning("%s failed (try %d, next in %.1f s): %s", what, retry.attempt_number,
                        retry.upcoming_sleep, error)

        def stop(retry: RetryCallState) -> bool:
            return not app.is_leader() if leader_only else stop_after_delay(COMMAND_TRIES_S)(retry)

        try:
            async for attempt in AsyncRetrying(wait=BACKOFF, stop=stop, retry=retry_if_exception_type(Exception),
                                               before_sleep=failed):
                with attempt:
                    return await loop.run_in_executor(None, work)
        except RetryError:
            log.warning("%s: given up (%s)", what, "no longer the leader" if leader_only else "still failing")
        return None

    @app.on_partitions_assigned.connect
    async def rebalanced(sender: faust.App, assigned: object, **kwargs: object) -> None:
        """A leader fenced by a newer one writes again only if a rebalance makes it lead."""
        if started:
            coordinator().leader_writer.rejoin()

    @app.agent(commands_topic)
    async def handle_commands(stream: faust.StreamT) -> None:
        await ready.wait()
        async for raw in stream:
            await guarded("deciding a command", lambda raw=raw: coordinator().handle_command(raw), leader_only=False)

    @app.timer(interval=min(settings.barriers.interval_ms, TICK_MS) / 1000.0, on_leader=True)
    async def barrier_clock() -> None:
        if not ready.is_set():
            return
        barrier = await guarded("the barrier clock", coordinator().tick_barrier, leader_only=True)
        if barrier is not None:
            log.debug("announced barrier %d", barrier.barrier)

    @app.timer(interval=PRUNE_S, on_leader=True)
    async def state_pruning() -> None:
        if ready.is_set():
            await guarded("pruning the state", coordinator().tick_prune, leader_only=True)

    @app.timer(interval=1.0, on_leader=True)
    async def lease_expiry() -> None:
        if ready.is_set():
            await guarded("expiring leases", coordinator().tick_leases, leader_only=True)

    # -- REST API (read-only views of the folded state) --

    def _state_or_503(web: View) -> Response | None:
        if not ready.is_set():
            return web.json({"error": "coordinator is still folding its state; retry shortly"}, status=503)
        return None

    @app.page("/health")
    async def health(web: View, request: Request) -> Response:
        up = ready.is_set()
        return web.json({"status": "ok" if up else "starting", "leader": app.is_leader() if up else False},
                        status=200 if up else 503)

    async def under_lock(read: Callable[[Coordinator], T]) -> T:
        """Run ``read`` on the folded state under the follower's lock, off the event loop: views
        scan the state, and the loop must stay free for the agents, timers and health checks."""
        c = coordinator()

        def locked() -> T:
            with c.follower.reader.lock:
                return read(c)

        return await asyncio.get_running_loop().run_in_executor(None, locked)

    def liveness() -> tuple[int, int]:
        return now_ms(), settings.barriers.liveness_ms

    @app.page("/state")
    async def state_view(web: View, request: Request) -> Response:
        if (busy := _state_or_503(web)) is not None:
            return busy
        return web.json(await under_lock(lambda c: {"state": c.state.canonical(), "hash": c.state.state_hash(),
                                                    "positions": dict(c.follower.reader.stats.positions)}))

    @app.page("/topology")
    async def topology_view(web: View, request: Request) -> Response:
        if (busy := _state_or_503(web)) is not None:
            return busy
        return web.json(await under_lock(lambda c: views.topology(c.state, *liveness())))

    @app.page("/tables/{name}")
    async def table_view(web: View, request: Request, name: str) -> Response:
        if (busy := _state_or_503(web)) is not None:
            return busy
        body = await under_lock(lambda c: views.table(c.state, name))
        if body is None:
            return web.json({"error": f"unknown table {name!r}"}, status=404)
        return web.json(body)

    @app.page("/barriers")
    async def barriers_view(web: View, request: Request) -> Response:
        if (busy := _state_or_503(web)) is not None:
            return busy
        try:
            start = _int_param(request, "from", 0) or 0
            limit = _int_param(request, "limit", 100) or 100
        except Rejected as exc:
            return web.json({"error": str(exc)}, status=400)
        return web.json(await under_lock(lambda c: views.barriers(c.state, start, limit)))

    @app.page("/snapshot")
    async def snapshot_view(web: View, request: Request) -> Response:
        if (busy := _state_or_503(web)) is not None:
            return busy
        names = [t for t in request.query.get("tables", "").split(",") if t]
        try:
            level = request.query.get("level", ReadLevel.READ_COMMITTED)
            as_of_barrier = _int_param(request, "as_of_barrier", None)
            as_of_timestamp = _int_param(request, "as_of_timestamp", None)
            snap = await under_lock(lambda c: resolve_snapshot(c.state, names, level, as_of_barrier, as_of_timestamp))
        except Rejected as exc:
            return web.json({"error": str(exc)}, status=400)
        return web.json(views.snapshot(snap, settings))

    @app.page("/delays")
    async def delays_view(web: View, request: Request) -> Response:
        if (busy := _state_or_503(web)) is not None:
            return busy
        try:
            last = _int_param(request, "last", 100) or 100
            since_ms = _int_param(request, "since_ms", None)
        except Rejected as exc:
            return web.json({"error": str(exc)}, status=400)
        return web.json(await under_lock(lambda c: views.delays(c.state, *liveness(), last, since_ms)))

    overview_cache: dict[str, tuple[float, object]] = {}  # one body a second, however many pages are open

    @app.page("/overview")
    async def overview_view(web: View, request: Request) -> Response:
        if (busy := _state_or_503(web)) is not None:
            return busy
        at, body = overview_cache.get("body", (0.0, None))
        if body is None or time.monotonic() - at >= OVERVIEW_TTL_S:
            body = await under_lock(lambda c: views.overview(c.state, *liveness(), list(c.rejections), c.started_at_ms))
            overview_cache["body"] = (time.monotonic(), body)
        return web.json(body)

    @app.page("/")
    async def page_view(web: View, request: Request) -> Response:
        return _static(web, "index.html")

    @app.page("/page/{name}")
    async def page_file(web: View, request: Request, name: str) -> Response:
        return _static(web, name)

    @app.page("/page/vendor/{name}")
    async def page_vendor_file(web: View, request: Request, name: str) -> Response:
        return _static(web, f"vendor/{name}")

    @app.page("/metrics")
    async def metrics_view(web: View, request: Request) -> Response:
        if (busy := _state_or_503(web)) is not None:
            return busy

        def text(c: Coordinator, backlog: dict[str, int] | None) -> bytes:
            stats = c.follower.reader.stats
            counters = {**asdict(c.counters), "events_folded": stats.events_folded, "decode_errors": stats.decode_errors,
                        "unknown_entities": stats.unknown_entities, "invalid_records": stats.invalid_records}
            return exposition(c.metrics, c.state, counters, *liveness(), backlog)

        try:
            backlog: dict[str, int] | None = await asyncio.get_running_loop().run_in_executor(None, coordinator().kafka_backlog)
        except Exception as exc:  # noqa: BLE001 - Kafka unreachable: the scrape still answers, without the backlog
            log.warning("no Kafka backlog for /metrics: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            backlog = None
        return web.bytes(await under_lock(lambda c: text(c, backlog)), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    return app


PAGE = Path(__file__).with_name("page")  # the live page: index.html, its script and style, vendor/ (uPlot)
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


def _static(web: View, name: str) -> Response:
    """A file of the live page; 404 for anything else (names are one path segment, no ``..``)."""
    path = PAGE / name
    if path.suffix not in CONTENT_TYPES or ".." in name or not path.is_file():
        hint = " (the charting library is fetched by scripts/setup)" if name.startswith("vendor/") else ""
        return web.json({"error": f"no page file {name!r}{hint}"}, status=404)
    return web.bytes(path.read_bytes(), content_type=CONTENT_TYPES[path.suffix])


def _int_param(request: Request, name: str, default: int | None) -> int | None:
    raw = request.query.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise Rejected(f"query parameter {name}={raw!r} must be a whole number") from None
