"""Who may do what: the role each command topic speaks for, and what each state topic may hold.

Kafka does not tell a consumer who produced a record, so a right comes from *where* the
record was written. Each role writes its own command topic (``P.commands.<role>``, and the
broker's ACLs let only that role's principals write it): the coordinator decides a command
with the role of the topic it came from (``decide(..., role=...)``). Each state topic holds a
fixed set of record kinds, so a principal that may write one topic cannot change the entities
another topic holds. docs/security.md shows the same table; a test reads it from there.

Example::

    >>> print(role_problem(Role.READER, "RequestRevision"))
    the reader role may not send RequestRevision: it may send AcquireLease, ReleaseLease (docs/security.md)
    >>> print(placement_problem("completions", "table:orders"))
    a table record on the completions topic: that topic holds completion records only
"""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum
from typing import Final


class Role(StrEnum):
    """A principal's role; its commands go to ``P.commands.<role>``."""

    READER = "reader"
    JOB = "job"
    OPERATOR = "operator"
    COORDINATOR = "coordinator"


# command -> the roles that may send it. Finer rules on top (role_problem's callers in decide):
# a lease is renewed or released only with its holder's secret (an operator may release any);
# a job may drop only a CREATE TABLE AS SELECT table that has no first commit (its own cleanup).
COMMAND_ROLES: Final[dict[str, frozenset[Role]]] = {
    "AcquireLease": frozenset({Role.READER, Role.JOB, Role.OPERATOR}),
    "ReleaseLease": frozenset({Role.READER, Role.JOB, Role.OPERATOR}),
    "DeclareTable": frozenset({Role.JOB, Role.OPERATOR}),
    "RegisterJob": frozenset({Role.JOB, Role.OPERATOR}),
    "RenewJob": frozenset({Role.JOB}),
    "DeregisterJob": frozenset({Role.JOB, Role.OPERATOR}),
    "DropTable": frozenset({Role.JOB, Role.OPERATOR}),
    "RequestRevision": frozenset({Role.OPERATOR}),
    "AbandonTable": frozenset({Role.COORDINATOR}),
}

# the role a client sends a command as, unless it says otherwise (the least one allowed, except
# that a drop is an operator's: a job drops only its own unfinished CTAS table, and says so)
DEFAULT_ROLES: Final[dict[str, Role]] = {
    "AcquireLease": Role.READER,
    "ReleaseLease": Role.READER,
    "DeclareTable": Role.JOB,
    "RegisterJob": Role.JOB,
    "RenewJob": Role.JOB,
    "DeregisterJob": Role.JOB,
    "DropTable": Role.OPERATOR,
    "RequestRevision": Role.OPERATOR,
    "AbandonTable": Role.COORDINATOR,
}

# state topic -> the entity kinds (keys ``<kind>:<id>``) its records may carry, tombstones included
STATE_KINDS: Final[dict[str, frozenset[str]]] = {
    "registry": frozenset({"table", "job"}),
    "barriers": frozenset({"barrier"}),
    "completions": frozenset({"completion"}),
    "leases": frozenset({"lease"}),
}


def role_problem(role: Role, command: str) -> str | None:
    """Why ``role`` may not send ``command`` (a command type's name) at all, or None."""
    allowed = COMMAND_ROLES.get(command)
    if allowed is None:
        return f"unknown command type {command}"
    if role in allowed:
        return None
    may = sorted(c for c, roles in COMMAND_ROLES.items() if role in roles)
    return f"the {role} role may not send {command}: it may send {', '.join(may) or 'nothing'} (docs/security.md)"


def placement_problem(topic: str, key: str) -> str | None:
    """Why a record keyed ``key`` must not be folded from state topic ``topic`` (its short name:
    ``registry``, ``barriers``, ``completions``, ``leases``), or None."""
    kinds = STATE_KINDS.get(topic)
    if kinds is None:
        return f"{topic} is not a state topic"
    kind = key.partition(":")[0]
    if kind in kinds:
        return None
    return f"a {kind or 'keyless'} record on the {topic} topic: that topic holds {' and '.join(sorted(kinds))} records only"


def secret_digest(secret: str) -> str:
    """What a lease keeps of its holder's secret (views and topics show only this).

    >>> secret_digest("s3cret") == secret_digest("s3cret") != secret_digest("other")
    True
    """
    return hashlib.sha256(secret.encode()).hexdigest()


def holds_secret(digest: str, secret: str) -> bool:
    """Whether ``secret`` is the one ``digest`` was made from (compared in constant time)."""
    return bool(digest) and bool(secret) and hmac.compare_digest(digest, secret_digest(secret))
