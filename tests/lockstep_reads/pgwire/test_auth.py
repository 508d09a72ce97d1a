"""SCRAM-SHA-256 as RFC 5802/7677 define it, checked against a client side computed here from
the RFC's formulas, and who is trusted without a password."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from lockstep_reads.pgwire.auth import ITERATIONS, AuthFailed, ScramExchange, ScramSecret, trusted


def client_final(password: str, client_first_bare: str, server_first: str) -> tuple[str, bytes]:
    """The client's final message and the server signature it expects (RFC 5802, section 3)."""
    attributes = dict(part.split("=", 1) for part in server_first.split(","))
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(attributes["s"]), int(attributes["i"]))
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    without_proof = f"c=biws,r={attributes['r']}"
    auth_message = f"{client_first_bare},{server_first},{without_proof}".encode()
    signature = hmac.digest(hashlib.sha256(client_key).digest(), auth_message, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server_signature = hmac.digest(hmac.digest(salted, b"Server Key", "sha256"), auth_message, "sha256")
    return f"{without_proof},p={base64.b64encode(proof).decode()}", server_signature


def test_the_right_password_is_proved_and_the_server_proves_itself() -> None:
    exchange = ScramExchange(ScramSecret.of("s3cret"))
    server_first = exchange.first("n,,n=,r=clientnonce")
    assert server_first.startswith("r=clientnonce") and f"i={ITERATIONS}" in server_first
    final, expected = client_final("s3cret", "n=,r=clientnonce", server_first)
    assert exchange.final(final) == "v=" + base64.b64encode(expected).decode()


@pytest.mark.parametrize("password", ["wrong", "", "s3cret "])
def test_a_wrong_password_fails(password: str) -> None:
    exchange = ScramExchange(ScramSecret.of("s3cret"))
    server_first = exchange.first("n,,n=,r=abc")
    with pytest.raises(AuthFailed, match="password authentication failed"):
        exchange.final(client_final(password, "n=,r=abc", server_first)[0])


def test_a_replayed_nonce_or_channel_binding_is_refused() -> None:
    exchange = ScramExchange(ScramSecret.of("s3cret"))
    with pytest.raises(AuthFailed, match="channel binding"):
        exchange.first("p=tls-server-end-point,,n=,r=abc")
    exchange.first("n,,n=,r=abc")
    with pytest.raises(AuthFailed, match="nonce"):
        exchange.final("c=biws,r=abcOTHER,p=AAAA")


@pytest.mark.parametrize(("host", "trust", "expected"), [
    ("127.0.0.1", "loopback", True), ("127.0.0.2", "loopback", True), ("::1", "loopback", True),
    ("10.1.2.3", "loopback", False), ("127.0.0.1", "none", False), ("not an address", "loopback", False),
])
def test_who_needs_no_password(host: str, trust: str, expected: bool) -> None:
    assert trusted(host, trust) is expected
