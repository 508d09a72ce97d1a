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
from collections.abc import Callable
from typing import NoReturn, TypeVar

import faust
from faust.auth import Credentials, SASLCredentials, SSLCredentials
from faust.web import Web
from tenacity import AsyncRetrying, RetryCallState, RetryError, retry_if_exception_type, stop_after_delay, wait_exponential

from coordinator.client.topics import Topics, ensure_topics
from coordinator.domain.errors import ExitCode
from coordinator.settings import KafkaSecurity, Settings
from coordinator.stream.coordinator import TICK_MS, Coordinator
from coordinator.stream.rest import add_views, serve_page

log = logging.getLogger(__name__)
T = TypeVar("T")
PRUNE_S = 5.0  # how often the leader forgets records below the retention floor
RESTORE_S = 0.5  # how soon the leader writes back a completion someone else's tombstone erased
BACKOFF = wait_exponential(multiplier=0.5, max=30)  # 0.5 s, 1 s, 2 s ... at most 30 s between tries
COMMAND_TRIES_S = 300.0  # a command still failing after this is skipped (its sender timed out long ago)


class LockstepApp(faust.App):
    """A Faust app that creates the coordinator's topics (with their configs) before its agents subscribe."""

    def __init__(self, settings: Settings, topics: Topics, **options: object) -> None:
        super().__init__(f"{settings.topic_prefix}-coordinator", **options)
        self.lockstep_settings = settings
        self.lockstep_topics = topics

    def on_webserver_init(self, web: Web) -> None:
        serve_page(web, self.lockstep_settings)

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
    commands_topic = app.topic(*topics.command_topics, key_type=bytes, value_type=bytes)
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
        async for event in stream.events():  # each command with the topic it came from: its sender's role
            raw, topic = event.value, event.message.topic
            await guarded("deciding a command", lambda raw=raw, topic=topic: coordinator().handle_command(raw, topic),
                          leader_only=False)

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

    @app.timer(interval=RESTORE_S, on_leader=True)
    async def completion_restore() -> None:
        if ready.is_set():
            await guarded("writing back erased completions", coordinator().tick_restore, leader_only=True)

    add_views(app, settings, coordinator, ready)
    return app

