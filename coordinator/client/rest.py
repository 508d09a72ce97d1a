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


def get_json(settings: Settings, path: str, timeout: float = 10.0) -> Any:
    """GET ``path`` from the coordinator's REST API; 4xx bodies with an error are returned as-is."""
    url = settings.coordinator_url.rstrip("/") + path
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if 400 <= exc.code < 500:
            return json.loads(exc.read())
        raise Unreachable(f"coordinator at {url} answered HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise Unreachable(
            f"coordinator not reachable at {url} ({exc}); start it with `lockstep worker` "
            "or set LOCKSTEP_COORDINATOR_URL"
        ) from exc
