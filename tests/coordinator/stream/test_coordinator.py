"""The Coordinator's command handling against the session's real broker, driven directly."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from coordinator.client.topics import Topics, ensure_topics
from coordinator.codec import default_codec
from coordinator.domain import DeclareTable, RequestRevision
from coordinator.domain.roles import Role
from coordinator.settings import Settings
from coordinator.stream import coordinator as module
from coordinator.stream.coordinator import Coordinator

pytestmark = [pytest.mark.integration]


def test_a_command_whose_deciding_raises_is_refused_with_why_and_the_next_one_is_decided(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = dataclasses.replace(settings, topic_prefix=f"t{uuid.uuid4().hex[:8]}")
    topics = Topics(settings.topic_prefix)
    ensure_topics(settings, topics)
    coordinator = Coordinator(settings, topics)
    coordinator.start()
    real_decide, codec = module.decide, default_codec()

    def decide(state: Any, command: Any, now_ms: int, role: Role | None = None) -> Any:
        if isinstance(command, RequestRevision):  # a bug in one handler, say
            raise KeyError("boom")
        return real_decide(state, command, now_ms, role)

    monkeypatch.setattr(module, "decide", decide)
    try:
        poison = coordinator.handle_command(codec.encode(RequestRevision("r1", "t", 0)), topics.commands_of(Role.OPERATOR))
        assert poison is not None and not poison.accepted
        assert poison.reason.startswith("the coordinator could not decide it (KeyError: 'boom')")
        after = coordinator.handle_command(codec.encode(DeclareTable("r2", "t", "root")), topics.commands_of(Role.JOB))
        assert after is not None and after.accepted
        legacy = coordinator.handle_command(codec.encode(DeclareTable("r3", "u", "root")), topics.commands)
        assert legacy is not None and not legacy.accepted and "predates roles" in legacy.reason
        assert coordinator.counters.commands_rejected == 2 and coordinator.counters.work_failures == 0
    finally:
        coordinator.stop()
