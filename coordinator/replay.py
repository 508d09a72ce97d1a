"""``lockstep replay``: read every state topic from the start into the same fold.

With ``verify`` it asks the live coordinator for its state *and the offsets it has folded*,
reads exactly up to those offsets, and compares the canonical dumps, so barriers announced
meanwhile cannot cause a false alarm.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.client.rest import get_json
from coordinator.client.state import ReaderStats, StateReader
from coordinator.client.topics import Topics
from coordinator.settings import Settings


@dataclass(frozen=True)
class ReplayResult:
    state_hash: str
    stats: ReaderStats
    live_hash: str | None = None
    differences: tuple[str, ...] = ()

    @property
    def verified(self) -> bool:
        return self.live_hash is not None and self.live_hash == self.state_hash


def replay(settings: Settings, verify: bool = False) -> ReplayResult:
    reader = StateReader(settings, Topics(settings.topic_prefix))
    try:
        if not verify:
            state = reader.read_to_end()
            return ReplayResult(state.state_hash(), reader.stats)
        live = get_json(settings, "/state")
        state = reader.read_until({t: int(o) for t, o in live["positions"].items()})
        mine = state.canonical(digests=False)  # as /state shows it
        differences = tuple(
            f"{section}: {len(mine[section])} entities replayed, {len(live['state'].get(section, {}))} live"
            + ("" if len(mine[section]) != len(live["state"].get(section, {})) else " (same count, different content)")
            for section in mine
            if mine[section] != live["state"].get(section)
        )
        return ReplayResult(state.state_hash(), reader.stats, live["hash"], differences)
    finally:
        reader.close()
