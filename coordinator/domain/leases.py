"""How many leases, how long and under what name a principal may hold, kept pure.

A lease blocks drops, pruning and vacuum at its barrier, and every ``lockstep serve`` client or
notebook may take them: without limits one careless loop (or a hostile reader) holds the
warehouse's history for a day and grows every reader's state. Readers and jobs are capped in
ttl, in leases per holder and in leases held in all; an operator's lease is exempt (up to
``MAX_LEASE_TTL_MS``), which is the override for a long audit. Renewing a lease one already
holds never counts as a new one.

Example::

    >>> from coordinator.domain.events import AcquireLease
    >>> from coordinator.domain.state import MetaState
    >>> two_hours = AcquireLease("r", "l1", "me", ("t",), 7, 7_200_000, "s")
    >>> print(lease_problem(two_hours, MetaState(), Role.READER, LeaseLimits()))  # doctest: +NORMALIZE_WHITESPACE
    lease ttl 7200000 ms is more than the 3600000 ms a reader may hold one
    (LOCKSTEP_LEASE_MAX_TTL_MS; an operator may hold one up to 86400000 ms)
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.events import AcquireLease
from coordinator.domain.roles import Role
from coordinator.domain.state import MetaState

MAX_LEASE_TTL_MS = 24 * 3600 * 1000  # no lease outlives a day, an operator's neither


@dataclass(frozen=True)
class LeaseLimits:
    """The caps on readers' and jobs' leases (``LOCKSTEP_LEASE_*``)."""

    max_ttl_ms: int = 3_600_000  # a reader renews every third of its ttl: an hour is generous
    per_holder: int = 256  # one holder name (a process: user@host:pid) holds at most this many (serve: 200 clients)
    total: int = 10_000  # all readers' and jobs' leases together (bounds every reader's state)
    holder_chars: int = 200


def lease_problem(cmd: AcquireLease, state: MetaState, role: Role | None, limits: LeaseLimits) -> str | None:
    """Why ``role`` may not take (or renew) the lease ``cmd`` asks for, or None."""
    if not cmd.holder or len(cmd.holder) > limits.holder_chars or not cmd.holder.isprintable():
        return (f"lease holder {cmd.holder[:limits.holder_chars]!r} is not a name: use 1-{limits.holder_chars} "
                "printable characters")
    ceiling = MAX_LEASE_TTL_MS if role in (None, Role.OPERATOR) else min(limits.max_ttl_ms, MAX_LEASE_TTL_MS)
    if not 0 < cmd.ttl_ms <= ceiling:
        if role in (None, Role.OPERATOR) or cmd.ttl_ms <= 0:
            return f"lease ttl {cmd.ttl_ms} ms is out of range: use 1 .. {ceiling} ms"
        return (f"lease ttl {cmd.ttl_ms} ms is more than the {ceiling} ms a {role} may hold one "
                f"(LOCKSTEP_LEASE_MAX_TTL_MS; an operator may hold one up to {MAX_LEASE_TTL_MS} ms)")
    if role in (None, Role.OPERATOR) or cmd.lease_id in state.leases:
        return None
    held = sum(1 for lease in state.leases.values() if lease.holder == cmd.holder)
    if held >= limits.per_holder:
        return (f"holder {cmd.holder!r} already holds {held} leases, the most one holder may "
                "(LOCKSTEP_LEASE_PER_HOLDER): release one first (Snapshot.close, or end the transaction)")
    if len(state.leases) >= limits.total:
        return (f"{len(state.leases)} leases are held, the most readers and jobs may hold together "
                "(LOCKSTEP_LEASE_TOTAL): wait for one to be released or to expire")
    return None
