"""The pure core: events, state, decide and fold. Standard library only, no I/O.

Example::

    from coordinator.domain import DeclareTable, MetaState, decide, fold

    state = MetaState()
    decision = decide(state, DeclareTable("r1", "shopping", "root"), now_ms=0)
    for fact in decision.facts:
        state = fold(state, fact)
    assert "shopping" in state.tables
"""

from coordinator.domain.decide import Decision, decide, expire_leases
from coordinator.domain.events import (
    AbandonTable,
    AcquireLease,
    BarrierAnnounced,
    BarrierCompleted,
    Command,
    CommandOutcome,
    CutEntry,
    DeclareTable,
    DeregisterJob,
    DropTable,
    Fact,
    GenerationStart,
    JobState,
    LeaseState,
    OffsetRange,
    PhaseTime,
    RegisterJob,
    ReleaseLease,
    RenewJob,
    RequestRevision,
    SourceVersion,
    TableState,
    TableStride,
    Tombstone,
    WriterTerm,
    entity_key,
)
from coordinator.domain.fold import fold, fold_all
from coordinator.domain.state import MetaState

__all__ = [
    "AbandonTable",
    "AcquireLease",
    "BarrierAnnounced",
    "BarrierCompleted",
    "Command",
    "CommandOutcome",
    "CutEntry",
    "DeclareTable",
    "Decision",
    "DeregisterJob",
    "DropTable",
    "Fact",
    "GenerationStart",
    "WriterTerm",
    "JobState",
    "LeaseState",
    "MetaState",
    "OffsetRange",
    "PhaseTime",
    "RegisterJob",
    "RenewJob",
    "ReleaseLease",
    "RequestRevision",
    "SourceVersion",
    "TableState",
    "TableStride",
    "Tombstone",
    "decide",
    "entity_key",
    "expire_leases",
    "fold",
    "fold_all",
]
