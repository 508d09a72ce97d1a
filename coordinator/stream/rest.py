"""The worker's REST API: read-only views of the folded state, the live page's files, /metrics.

Every view of the state answers 503 until the worker has folded it, and 400 for a query
parameter it cannot use. The page's files are served by aiohttp's static files (which resolve
a path inside the page folder or answer 404), and a request whose Host header does not name
the address the worker listens on is refused, so a web page elsewhere cannot reach the API
through a DNS name that points at this machine (DNS rebinding).

Example::

    add_views(app, settings, coordinator, ready)   # what create_app does
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import faust
from aiohttp import web as aioweb
from faust.web import Request, Response, View
from prometheus_client import CONTENT_TYPE_LATEST

from coordinator.client.clock import now_ms
from coordinator.domain.errors import Rejected
from coordinator.domain.snapshot import ReadLevel, resolve_snapshot
from coordinator.settings import Settings
from coordinator.stream import views
from coordinator.stream.coordinator import Coordinator
from coordinator.stream.metrics import exposition

log = logging.getLogger(__name__)
T = TypeVar("T")
PAGE = Path(__file__).with_name("page")  # the live page: index.html, its script and style, vendor/ (uPlot)
VIEW_THREADS = 2
OVERVIEW_TTL_S = 0.9  # the page polls every second: each open page reuses the same body within it
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
Handler = Callable[..., Awaitable[Response]]


def allowed_hosts(host: str, port: int) -> frozenset[str] | None:
    """The Host headers a worker listening on ``host``:``port`` answers (None: any, for a worker
    that listens on every interface, whose names only its operator knows).

    >>> sorted(allowed_hosts("127.0.0.1", 6066))[:3]
    ['127.0.0.1', '127.0.0.1:6066', '::1']
    >>> allowed_hosts("0.0.0.0", 6066) is None
    True
    """
    names = {host.lower()}
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        address = None
    if address is not None and address.is_unspecified:
        return None
    if host.lower() in LOOPBACK_NAMES or (address is not None and address.is_loopback):
        names |= LOOPBACK_NAMES
    return frozenset({*names, *(f"{name}:{port}" for name in names)})


def host_check(allowed: frozenset[str] | None) -> Any:
    """aiohttp middleware: 421 for a request whose Host is not one of ``allowed``; 404, not 500
    and a traceback, for a page file name the file system refuses (aiohttp lets ``File name too
    long`` through)."""

    @aioweb.middleware
    async def check(request: aioweb.Request, handler: Any) -> aioweb.StreamResponse:
        host = request.headers.get("Host", "")  # as sent: aiohttp's request.host fills in a missing one
        if allowed is not None and host.lower() not in allowed:
            return aioweb.json_response({"error": f"host {host!r} is not this worker's address; use one "
                                                  "of " + ", ".join(sorted(allowed))}, status=421)
        try:
            return await handler(request)
        except OSError:
            if not request.path.startswith("/page/"):
                raise
            return aioweb.json_response({"error": "no such page file"}, status=404)

    return check


def serve_page(web: Any, settings: Settings) -> None:
    """Give the worker's web server its page files and its Host check (``on_webserver_init``)."""
    web.web_app.middlewares.append(host_check(allowed_hosts(settings.coordinator_host, settings.coordinator_port)))
    web.add_static("/page/", PAGE, follow_symlinks=False)


def add_views(app: faust.App, settings: Settings, coordinator: Callable[[], Coordinator], ready: asyncio.Event) -> None:
    """Register every REST view of the worker on ``app``."""

    def liveness() -> tuple[int, int]:
        return now_ms(), settings.barriers.liveness_ms

    # views scan the state on threads of their own: a burst of requests then waits for these,
    # never for the threads the commands agent and the leader's timers run on
    pool = ThreadPoolExecutor(max_workers=VIEW_THREADS, thread_name_prefix="lockstep-views")

    async def off_loop(work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, work)

    async def under_lock(read: Callable[[Coordinator], T]) -> T:
        """Run ``read`` on the folded state under the follower's lock, off the event loop: views
        scan the state, and the loop must stay free for the agents, timers and health checks."""
        c = coordinator()

        def locked() -> T:
            with c.follower.reader.lock:
                return read(c)

        return await off_loop(locked)

    def state_page(path: str) -> Callable[[Handler], Handler]:
        """Register a view of the folded state: 503 until it is folded, 400 on a Rejected."""

        def register(handler: Handler) -> Handler:
            async def view(web: View, request: Request, **params: str) -> Response:
                if not ready.is_set():
                    return web.json({"error": "coordinator is still folding its state; retry shortly"}, status=503)
                try:
                    return await handler(web, request, **params)
                except Rejected as exc:
                    return web.json({"error": str(exc)}, status=400)

            view.__name__ = handler.__name__
            app.page(path)(view)
            return view

        return register

    @app.page("/health")
    async def health(web: View, request: Request) -> Response:
        up = ready.is_set()
        return web.json({"status": "ok" if up else "starting", "leader": app.is_leader() if up else False},
                        status=200 if up else 503)

    @state_page("/state")
    async def state_view(web: View, request: Request) -> Response:
        # the lock is held for a copy only (the fold waits that long), the dump is made after
        state, positions = await under_lock(lambda c: (c.state.copy(), dict(c.follower.reader.stats.positions)))
        return web.json(await off_loop(lambda: {"state": state.canonical(digests=False), "hash": state.state_hash(),
                                                "positions": positions}))

    @state_page("/topology")
    async def topology_view(web: View, request: Request) -> Response:
        return web.json(await under_lock(lambda c: views.topology(c.state, *liveness())))

    @state_page("/tables/{name}")
    async def table_view(web: View, request: Request, name: str) -> Response:
        body = await under_lock(lambda c: views.table(c.state, name))
        if body is None:
            return web.json({"error": f"unknown table {name!r}"}, status=404)
        return web.json(body)

    @state_page("/barriers")
    async def barriers_view(web: View, request: Request) -> Response:
        start = int_param(request, "from", 0) or 0
        limit = int_param(request, "limit", 100) or 100
        return web.json(await under_lock(lambda c: views.barriers(c.state, start, limit)))

    @state_page("/snapshot")
    async def snapshot_view(web: View, request: Request) -> Response:
        names = [t for t in request.query.get("tables", "").split(",") if t]
        level = request.query.get("level", ReadLevel.READ_COMMITTED)
        as_of_barrier = int_param(request, "as_of_barrier", None)
        as_of_timestamp = int_param(request, "as_of_timestamp", None)
        snap = await under_lock(lambda c: resolve_snapshot(c.state, names, level, as_of_barrier, as_of_timestamp))
        return web.json(views.snapshot(snap, settings))

    @state_page("/delays")
    async def delays_view(web: View, request: Request) -> Response:
        last = int_param(request, "last", 100) or 100
        since_ms = int_param(request, "since_ms", None)
        return web.json(await under_lock(lambda c: views.delays(c.state, *liveness(), last, since_ms)))

    overview_cache: dict[str, tuple[float, object]] = {}  # one body a second, however many pages are open

    @state_page("/overview")
    async def overview_view(web: View, request: Request) -> Response:
        at, body = overview_cache.get("body", (0.0, None))
        if body is None or time.monotonic() - at >= OVERVIEW_TTL_S:
            body = await under_lock(lambda c: views.overview(c.state, *liveness(), list(c.rejections), c.started_at_ms))
            overview_cache["body"] = (time.monotonic(), body)
        return web.json(body)

    @app.page("/")
    async def page_view(web: View, request: Request) -> Response:
        return web.bytes((PAGE / "index.html").read_bytes(), content_type="text/html")

    @state_page("/metrics")
    async def metrics_view(web: View, request: Request) -> Response:
        def text(c: Coordinator, backlog: dict[str, int] | None) -> bytes:
            stats = c.follower.reader.stats
            counters = {**asdict(c.counters), "events_folded": stats.events_folded, "decode_errors": stats.decode_errors,
                        "unknown_entities": stats.unknown_entities, "invalid_records": stats.invalid_records}
            return exposition(c.metrics, c.state, counters, *liveness(), backlog)

        try:
            backlog: dict[str, int] | None = await off_loop(coordinator().kafka_backlog)
        except Exception as exc:  # noqa: BLE001 - Kafka unreachable: the scrape still answers, without the backlog
            log.warning("no Kafka backlog for /metrics: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            backlog = None
        return web.bytes(await under_lock(lambda c: text(c, backlog)), content_type=CONTENT_TYPE_LATEST.split(";")[0])


def int_param(request: Request, name: str, default: int | None) -> int | None:
    """A whole-number query parameter (``Rejected`` naming it otherwise)."""
    raw = request.query.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise Rejected(f"query parameter {name}={raw!r} must be a whole number") from None
