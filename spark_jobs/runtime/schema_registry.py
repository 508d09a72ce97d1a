"""A client of a Confluent-compatible schema registry (Confluent's, Apicurio's ``/apis/ccompat/v7``,
Karapace): the writer schema of a record by its id, and the schemas registered under a subject.

A schema id never changes meaning, so what was fetched is kept for the life of the process.
The three ways a registry lets a job down are kept apart, because each calls for something else:
an id it does not know (``UnknownSchema``: that record goes to the dead letters), a registry that
does not answer (``RegistryUnavailable``: the job waits and says so, nothing is dropped), and a
URL that is not a registry at all (``RegistryError``: the job does not start; the message names
``LOCKSTEP_SCHEMA_REGISTRY_URL``).

Example::

    registry = SchemaRegistry("http://127.0.0.1:8081/apis/ccompat/v7")
    registry.check()                            # raises RegistryError if the URL is not a registry
    registry.subject("shop.public.orders-value")  # {2: '{"type": "record", ...}', 7: '...'}
    registry.schema(7)                          # the schema's JSON text
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class RegistryError(RuntimeError):
    """The schema registry's URL does not lead to a schema registry."""


class RegistryUnavailable(RuntimeError):
    """The schema registry did not answer (down, unreachable, or failing): try again later."""


class UnknownSchema(LookupError):
    """The registry answers but knows no schema with this id."""


_CACHE: dict[tuple[str, int], str] = {}  # (registry URL, schema id) -> schema JSON, shared by a process
_LOCK = threading.Lock()
# (registry URL, schema id) -> (why it is unknown, until when that answer stands): every record
# with an unknown id goes to the dead letters, but only one in UNKNOWN_TTL_S asks the registry
_UNKNOWN: dict[tuple[str, int], tuple[str, float]] = {}
UNKNOWN_TTL_S = 60.0


class SchemaRegistry:
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        if not url:
            raise RegistryError("no schema registry: set LOCKSTEP_SCHEMA_REGISTRY_URL to a Confluent-compatible "
                                "registry, e.g. http://127.0.0.1:8081/apis/ccompat/v7 (lockstep dev up --registry)")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._versions: dict[tuple[str, int], tuple[int, str]] = {}  # (subject, version) -> (id, schema)

    def _get(self, path: str) -> tuple[int, Any]:
        """(status, parsed JSON) of a GET; 404 is an answer, other failures raise."""
        request = urllib.request.Request(f"{self.url}{path}", headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            body = exc.read()
            if exc.code >= 500 or exc.code == 429:
                raise RegistryUnavailable(f"the schema registry at {self.url} failed: GET {path} answered {exc.code}") from exc
            try:
                return exc.code, json.loads(body or b"null")
            except ValueError:
                return exc.code, None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RegistryUnavailable(f"the schema registry at {self.url} does not answer ({reason})") from exc
        except ValueError as exc:
            raise RegistryError(f"LOCKSTEP_SCHEMA_REGISTRY_URL={self.url} answered GET {path} with something that "
                                "is not JSON: is it a Confluent-compatible registry's URL (for Apicurio, "
                                "http://HOST:PORT/apis/ccompat/v7)?") from exc

    def check(self) -> None:
        """Raise ``RegistryError`` unless the URL answers as a registry (``GET /subjects``: a list)."""
        status, body = self._get("/subjects")
        if status != 200 or not isinstance(body, list):
            raise RegistryError(f"LOCKSTEP_SCHEMA_REGISTRY_URL={self.url} is not a Confluent-compatible schema "
                                f"registry: GET /subjects answered {status}. For Apicurio use "
                                "http://HOST:PORT/apis/ccompat/v7; for Confluent's, http://HOST:PORT")

    def schema(self, schema_id: int) -> str:
        """The schema with this id, as JSON text."""
        key = (self.url, schema_id)
        with _LOCK:
            if key in _CACHE:
                return _CACHE[key]
            why, until = _UNKNOWN.get(key, ("", 0.0))
        if time.monotonic() < until:
            raise UnknownSchema(why)
        status, body = self._get(f"/schemas/ids/{schema_id}")
        if status == 404:
            raise self._unknown(key, f"schema id {schema_id} is not in the schema registry at {self.url}")
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise RegistryError(f"the schema registry at {self.url} answered GET /schemas/ids/{schema_id} with {status}")
        if body.get("schemaType", "AVRO") != "AVRO":
            raise self._unknown(key, f"schema id {schema_id} is a {body['schemaType']} schema, not Avro")
        with _LOCK:
            _CACHE[key] = body["schema"]
        return str(body["schema"])

    @staticmethod
    def _unknown(key: tuple[str, int], why: str) -> UnknownSchema:
        with _LOCK:
            _UNKNOWN[key] = (why, time.monotonic() + UNKNOWN_TTL_S)
        return UnknownSchema(why)

    def subject(self, subject: str) -> dict[int, str]:
        """Every schema registered under ``subject`` (id -> JSON text); empty if there is no such subject."""
        name = urllib.parse.quote(subject, safe="")
        status, versions = self._get(f"/subjects/{name}/versions")
        if status == 404:
            return {}
        if status != 200 or not isinstance(versions, list):
            raise RegistryError(f"the schema registry at {self.url} answered GET /subjects/{name}/versions with {status}")
        for version in versions:
            if (subject, version) in self._versions:  # a version never changes: asked once
                continue
            status, body = self._get(f"/subjects/{name}/versions/{version}")
            if status == 200 and isinstance(body, dict) and isinstance(body.get("id"), int):
                self._versions[(subject, version)] = (body["id"], body["schema"])
                with _LOCK:
                    _CACHE[(self.url, body["id"])] = body["schema"]
        return dict(self._versions[(subject, v)] for v in versions if (subject, v) in self._versions)
