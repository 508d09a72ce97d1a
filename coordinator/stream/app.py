"""The Faust app: the coordinator worker (``lockstep worker`` or ``faust -A coordinator.stream.app worker``).

Agents and timers only schedule the Coordinator's work: the commands agent decodes and
decides, the barrier clock and lease expiry run on the Faust leader only, and the web views
serve the folded state. Configuration: ``LOCKSTEP_*`` variables plus
``LOCKSTEP_BARRIER_INTERVAL_MS`` / ``_MAX_INFLIGHT`` and ``LOCKSTEP_JOB_LIVENESS_MS``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import asdict
from urllib.parse import urlparse

import faust
from faust.web import Request, Response, View

from coordinator.client.topics import Topics, ensure_topics
from coordinator.domain.barriers import BarrierConfig
from coordinator.domain.errors import Rejected
from coordinator.domain.snapshot import resolve_snapshot
from coordinator.settings import Settings
from coordinator.stream import views
from coordinator.stream.coordinator import TICK_MS, Coordinator

log = logging.getLogger(__name__)

settings = Settings.from_env()
topics = Topics(settings.topic_prefix)
barrier_config = BarrierConfig(
    interval_ms=int(os.environ.get("LOCKSTEP_BARRIER_INTERVAL_MS", "1000")),
    max_inflight=int(os.environ.get("LOCKSTEP_BARRIER_MAX_INFLIGHT", "3")),
    liveness_ms=int(os.environ.get("LOCKSTEP_JOB_LIVENESS_MS", "30000")),
)
_url = urlparse(settings.coordinator_url)
_datadir = (settings.home / "coordinator" / str(_url.port or 6066)).absolute()
_datadir.mkdir(parents=True, exist_ok=True)

class LockstepApp(faust.App):
    async def on_first_start(self) -> None:
        # Our topics must exist (with their configs) before the agents subscribe.
        created = await asyncio.get_running_loop().run_in_executor(None, ensure_topics, settings, topics)
        if created:
            log.info("created topics: %s", ", ".join(created))
        await super().on_first_start()


app = LockstepApp(
    f"{settings.topic_prefix}-coordinator",
    broker=[f"kafka://{hp}" for hp in settings.bootstrap.split(",")],
    store="memory://",
    key_serializer="raw",
    value_serializer="raw",
    topic_partitions=1,
    topic_replication_factor=settings.replication_factor,
    web_host=_url.hostname or "127.0.0.1",
    web_bind=_url.hostname or "127.0.0.1",  # listen on the URL's host only (Faust binds 0.0.0.0 by default)
    web_port=_url.port or 6066,
    broker_session_timeout=10.0,
    broker_heartbeat_interval=2.0,
    datadir=str(_datadir),
)
commands_topic = app.topic(topics.commands, key_type=bytes, value_type=bytes)

_ready = asyncio.Event()
_coordinator: Coordinator | None = None


def coordinator() -> Coordinator:
    assert _coordinator is not None, "coordinator not started"
    return _coordinator


@app.task
async def _start() -> None:
    global _coordinator
    loop = asyncio.get_running_loop()
    _coordinator = Coordinator(settings, topics, barrier_config)
    await loop.run_in_executor(None, _coordinator.start)
    log.info("state folded: %d events, hash %s", _coordinator.follower.reader.stats.events_folded,
             _coordinator.state.state_hash())
    _ready.set()


@app.agent(commands_topic)
async def handle_commands(stream: faust.StreamT) -> None:
    await _ready.wait()
    loop = asyncio.get_running_loop()
    async for raw in stream:
        await loop.run_in_executor(None, coordinator().handle_command, raw)


@app.timer(interval=min(barrier_config.interval_ms, TICK_MS) / 1000.0, on_leader=True)
async def barrier_clock() -> None:
    if not _ready.is_set():
        return
    barrier = await asyncio.get_running_loop().run_in_executor(None, coordinator().tick_barrier)
    if barrier is not None:
        log.debug("announced barrier %d", barrier.barrier)


@app.timer(interval=1.0, on_leader=True)
async def lease_expiry() -> None:
    if _ready.is_set():
        await asyncio.get_running_loop().run_in_executor(None, coordinator().tick_leases)


# -- REST API -----------------------------------------------------------------------------------


def _state_or_503(web: View) -> Response | None:
    if not _ready.is_set():
        return web.json({"error": "coordinator is still folding its state; retry shortly"}, status=503)
    return None


@app.page("/health")
async def health(web: View, request: Request) -> Response:
    ready = _ready.is_set()
    return web.json({"status": "ok" if ready else "starting", "leader": app.is_leader() if ready else False},
                    status=200 if ready else 503)


@app.page("/state")
async def state_view(web: View, request: Request) -> Response:
    if (busy := _state_or_503(web)) is not None:
        return busy
    c = coordinator()
    with c.follower.reader.lock:
        body = {
            "state": c.state.canonical(),
            "hash": c.state.state_hash(),
            "positions": dict(c.follower.reader.stats.positions),
        }
    return web.json(body)


@app.page("/topology")
async def topology_view(web: View, request: Request) -> Response:
    if (busy := _state_or_503(web)) is not None:
        return busy
    with coordinator().follower.reader.lock:
        return web.json(views.topology(coordinator().state))


@app.page("/tables/{name}")
async def table_view(web: View, request: Request, name: str) -> Response:
    if (busy := _state_or_503(web)) is not None:
        return busy
    with coordinator().follower.reader.lock:
        body = views.table(coordinator().state, name)
    if body is None:
        return web.json({"error": f"unknown table {name!r}"}, status=404)
    return web.json(body)


def _int_param(request: Request, name: str, default: int | None) -> int | None:
    raw = request.query.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise Rejected(f"query parameter {name}={raw!r} must be a whole number") from None


@app.page("/barriers")
async def barriers_view(web: View, request: Request) -> Response:
    if (busy := _state_or_503(web)) is not None:
        return busy
    try:
        start = _int_param(request, "from", 0) or 0
        limit = _int_param(request, "limit", 100) or 100
    except Rejected as exc:
        return web.json({"error": str(exc)}, status=400)
    with coordinator().follower.reader.lock:
        return web.json(views.barriers(coordinator().state, start, limit))


@app.page("/snapshot")
async def snapshot_view(web: View, request: Request) -> Response:
    if (busy := _state_or_503(web)) is not None:
        return busy
    names = [t for t in request.query.get("tables", "").split(",") if t]
    try:
        with coordinator().follower.reader.lock:
            snap = resolve_snapshot(
                coordinator().state,
                names,
                request.query.get("level", "read-committed"),
                _int_param(request, "as_of_barrier", None),
                _int_param(request, "as_of_timestamp", None),
            )
    except Rejected as exc:
        return web.json({"error": str(exc)}, status=400)
    return web.json(asdict(snap))


@app.page("/delays")
async def delays_view(web: View, request: Request) -> Response:
    if (busy := _state_or_503(web)) is not None:
        return busy
    try:
        last = _int_param(request, "last", 100) or 100
        since_ms = _int_param(request, "since_ms", None)
    except Rejected as exc:
        return web.json({"error": str(exc)}, status=400)
    with coordinator().follower.reader.lock:
        return web.json(views.delays(coordinator().state, last, since_ms))


@app.page("/metrics")
async def metrics_view(web: View, request: Request) -> Response:
    if (busy := _state_or_503(web)) is not None:
        return busy
    c = coordinator()
    stats = c.follower.reader.stats
    counters = {**asdict(c.counters), "events_folded": stats.events_folded, "decode_errors": stats.decode_errors,
                "unknown_entities": stats.unknown_entities}
    with c.follower.reader.lock:
        text = views.metrics(c.state, counters)
    return web.text(text, content_type="text/plain; version=0.0.4")
