"""The limits of ``lockstep serve``, with PostgreSQL's and Materialize's names and units.

Three are session settings a client may ``SET`` (and ``SHOW``), with the server's flags as
defaults: ``statement_timeout`` (57014 when it passes), ``idle_in_transaction_session_timeout``
(25P03, the session ends and its lease goes) and ``max_result_size`` (53200). The rest hold
before a client is trusted: how long startup and authentication may take, how large a message
may be before it, how large a statement may be at all (54000), and how many prepared statements
and portals one connection may keep.

Example::

    >>> duration_ms("statement_timeout", "5s"), duration_ms("statement_timeout", "250")
    (5000, 250)
    >>> size_bytes("max_result_size", "1GB")
    1073741824
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

DURATION_UNITS = {"us": 0.001, "ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
SIZE_UNITS = {"b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40}
SETTABLE = ("statement_timeout", "idle_in_transaction_session_timeout", "max_result_size")


class LimitError(ValueError):
    """A value a limit cannot take; the message says which forms it takes."""


@dataclass(frozen=True)
class Limits:
    """See the module; 0 turns a timeout or the result size off."""

    statement_timeout_ms: int = 60_000
    idle_in_transaction_ms: int = 120_000
    max_result_bytes: int = 1 << 30
    statement_bytes: int = 1 << 20  # the text of one Query or Parse message
    startup_s: float = 10.0  # from connect to authenticated
    preauth_bytes: int = 8192  # any message before authentication
    auth_failure_delay_s: float = 1.0  # before a failed password is answered
    prepared: int = 1000  # named prepared statements, and portals, per connection

    def defaults(self) -> dict[str, str]:
        """The settable ones as a new session shows them."""
        return {"statement_timeout": f"{self.statement_timeout_ms}ms",
                "idle_in_transaction_session_timeout": f"{self.idle_in_transaction_ms}ms",
                "max_result_size": f"{self.max_result_bytes}B"}


def _number_unit(name: str, value: str, units: Mapping[str, float], default_unit: str) -> float:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
    unit = (match[2] or default_unit).lower() if match else ""
    if match is None or unit not in units:
        forms = ", ".join(units)
        raise LimitError(f'invalid value for parameter "{name}": "{value}" (a number, optionally with a unit: {forms})')
    return float(match[1]) * units[unit]


def duration_ms(name: str, value: str) -> int:
    """A duration in PostgreSQL's forms (``250``, ``5s``, ``2min``; no unit: ms) as ms."""
    return int(_number_unit(name, value, DURATION_UNITS, "ms"))


def size_bytes(name: str, value: str) -> int:
    """A size in Materialize's forms (``1048576``, ``100MB``, ``1GB``; no unit: bytes) as bytes."""
    return int(_number_unit(name, value, SIZE_UNITS, "b"))


def check(name: str, value: str) -> str:
    """``value`` if ``name`` can take it (``LimitError`` otherwise), as the session keeps it."""
    (duration_ms if name != "max_result_size" else size_bytes)(name, value)
    return value
