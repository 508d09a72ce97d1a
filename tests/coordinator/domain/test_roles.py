"""The role table in docs/security.md is the one the coordinator decides with."""

from __future__ import annotations

from pathlib import Path

from coordinator.domain.events import EVENT_TYPES
from coordinator.domain.roles import COMMAND_ROLES, DEFAULT_ROLES, STATE_KINDS, Role, placement_problem, role_problem

SECURITY = Path(__file__).resolve().parents[3] / "docs" / "security.md"


def documented_roles() -> dict[str, frozenset[Role]]:
    """command -> roles from the table after the ``roles`` marker in docs/security.md."""
    lines = SECURITY.read_text().split("<!-- roles: the table tests read -->", 1)[1].strip().splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    table = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        table[cells["command"]] = frozenset(role for role in Role if cells[role.value] == "yes")
    return table


def test_the_documented_table_is_the_one_decided_with() -> None:
    assert documented_roles() == COMMAND_ROLES


def test_every_command_has_roles_and_a_usual_sender_the_table_allows() -> None:
    commands = {t.__name__ for t in EVENT_TYPES if "request_id" in t.__dataclass_fields__ and t.__name__ != "CommandOutcome"}
    assert set(COMMAND_ROLES) == set(DEFAULT_ROLES) == commands
    assert all(DEFAULT_ROLES[c] in COMMAND_ROLES[c] for c in commands)


def test_a_refusal_says_what_the_role_may_do() -> None:
    assert role_problem(Role.OPERATOR, "RequestRevision") is None
    assert role_problem(Role.JOB, "AbandonTable") == (
        "the job role may not send AbandonTable: it may send AcquireLease, DeclareTable, DeregisterJob, DropTable, "
        "RegisterJob, ReleaseLease, RenewJob (docs/security.md)")
    assert role_problem(Role.READER, "Nonsense") == "unknown command type Nonsense"


def test_each_state_topic_holds_its_own_kinds_only() -> None:
    keys = {"table": "table:t", "job": "job:j", "barrier": "barrier:3", "completion": "completion:t@3", "lease": "lease:l"}
    for topic, kinds in STATE_KINDS.items():
        for kind, key in keys.items():
            assert (placement_problem(topic, key) is None) == (kind in kinds), (topic, key)
    assert placement_problem("completions", "req-1") is not None  # an outcome, say
    assert placement_problem("commands", "table:t") == "commands is not a state topic"
