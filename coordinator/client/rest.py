"""GET the coordinator's REST API (read-only views of its state).

Example::

    state = get_json(settings, "/state")
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from coordinator.domain.errors import Unreachable
from coordinator.settings import Settings

# Per URL list, the coordinator that answered last: asked first next time
_answered: dict[tuple[str, ...], str] = {}


def get_json(settings: Settings, path: str, timeout: float = 10.0) -> Any:
    """GET ``path`` from the coordinator's REST API; 4xx bodies with an error are returned as-is.

    With several workers in ``LOCKSTEP_COORDINATOR_URL`` each is asked in turn (the one that
    answered last first) until one answers: any worker, leader or standby, serves the views."""
    urls = settings.coordinator_urls
    last = _answered.get(urls)
    failures: list[str] = []
    for base in sorted(urls, key=lambda u: u != last):
        url = base.rstrip("/") + path
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500:
                return json.loads(exc.read())
            failures.append(f"coordinator at {url} answered HTTP {exc.code}")
        except (urllib.error.URLError, OSError) as exc:
            failures.append(f"coordinator not reachable at {url} ({exc})")
        else:
            _answered[urls] = base
            return body
    hint = ("" if failures[-1].startswith("coordinator at")
            else "; start it with `lockstep worker` or set LOCKSTEP_COORDINATOR_URL")
    raise Unreachable("; ".join(failures) + hint)
