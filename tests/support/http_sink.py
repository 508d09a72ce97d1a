"""A local HTTP endpoint that keeps what is POSTed to it (JSON bodies), for transports under test
(OpenLineage's HTTP transport): a real server on 127.0.0.1, a real client."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


class HttpSink:
    def __init__(self) -> None:
        self.posts: list[tuple[str, Any]] = []  # (path, JSON body) in arrival order
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.posts.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def bodies(self, path: str) -> list[Any]:
        return [body for at, body in self.posts if at == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def make_http_sink() -> Iterator[Callable[[], HttpSink]]:
    """Factory: a started HttpSink; stopped at the end of the test."""
    sinks: list[HttpSink] = []

    def make() -> HttpSink:
        sinks.append(HttpSink())
        return sinks[-1]

    yield make
    for sink in sinks:
        sink.close()
