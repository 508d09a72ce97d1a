"""Who may connect: clients on this machine's loopback without a password (as PostgreSQL's
``trust`` for local connections), everyone else only with ``LOCKSTEP_SERVE_PASSWORD``, proved
by SCRAM-SHA-256 (RFC 5802/7677, what libpq and the JDBC driver speak), so the password never
crosses the network.

Example::

    >>> trusted("127.0.0.1", "loopback"), trusted("10.0.0.7", "loopback"), trusted("::1", "none")
    (True, False, False)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096
TRUST = ("loopback", "none")


class AuthFailed(Exception):
    """The client did not prove the password (or spoke SCRAM wrongly)."""


def trusted(host: str, trust: str) -> bool:
    """Whether a client at ``host`` connects without a password under the ``trust`` policy."""
    if trust != "loopback":
        return False
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ScramSecret:
    """What the server keeps of the password: salt and keys, never the password itself."""

    salt: bytes
    stored_key: bytes = field(repr=False)  # the keys stay out of reprs, logs and errors
    server_key: bytes = field(repr=False)

    @classmethod
    def of(cls, password: str, salt: bytes | None = None) -> ScramSecret:
        salt = salt or secrets.token_bytes(16)
        salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, ITERATIONS)
        client_key = hmac.digest(salted, b"Client Key", "sha256")
        return cls(salt, hashlib.sha256(client_key).digest(), hmac.digest(salted, b"Server Key", "sha256"))


def _attributes(message: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in message.split(",") if "=" in part)


class ScramExchange:
    """One server side of a SCRAM-SHA-256 exchange: ``first`` answers the client's first
    message, ``final`` checks its proof and returns the server's signature."""

    def __init__(self, secret: ScramSecret) -> None:
        self.secret = secret
        self.nonce = ""
        self.client_first_bare = ""
        self.server_first = ""

    def first(self, client_first: str) -> str:
        header, _, bare = client_first.partition(",")  # gs2 header: channel binding flag, authzid
        if header not in ("n", "y") or not bare.startswith(","):
            raise AuthFailed("SCRAM without channel binding is spoken here (the connection has no TLS)")
        self.client_first_bare = bare[1:]
        client_nonce = _attributes(self.client_first_bare).get("r", "")
        if not client_nonce:
            raise AuthFailed("the client's SCRAM message has no nonce")
        self.nonce = client_nonce + base64.b64encode(secrets.token_bytes(18)).decode()
        self.server_first = f"r={self.nonce},s={base64.b64encode(self.secret.salt).decode()},i={ITERATIONS}"
        return self.server_first

    def final(self, client_final: str) -> str:
        without_proof, _, proof_part = client_final.rpartition(",p=")
        attributes = _attributes(without_proof)
        if attributes.get("r") != self.nonce or not proof_part:
            raise AuthFailed("the client's SCRAM nonce does not match")
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        signature = hmac.digest(self.secret.stored_key, auth_message, "sha256")
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError as exc:
            raise AuthFailed("the client's SCRAM proof is not base64") from exc
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
        if len(proof) != len(signature) or not hmac.compare_digest(hashlib.sha256(client_key).digest(),
                                                                     self.secret.stored_key):
            raise AuthFailed("password authentication failed")
        return "v=" + base64.b64encode(hmac.digest(self.secret.server_key, auth_message, "sha256")).decode()
