"""Free ports for the local servers: below the ephemeral range, so no client connection takes one
between the pick and the server's bind."""

from __future__ import annotations

import socket

from lockstep.dev.service import HOST, _ephemeral_low, free_port


def test_free_ports_lie_below_the_ephemeral_range_and_can_be_bound() -> None:
    low = _ephemeral_low()
    first = free_port()
    ports = {first} | {free_port(frozenset({first})) for _ in range(20)}
    assert all(1024 <= p < low for p in ports) and len(ports) > 1
    with socket.socket() as taken:
        taken.bind((HOST, first))
        taken.listen()
        assert all(free_port() != first for _ in range(50))  # a port someone listens on is never handed out
