"""The Faust app is built from the Settings it is given; importing its module does no work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from coordinator.settings import Settings
from coordinator.stream.app import create_app

ROOT = Path(__file__).resolve().parents[3]


def test_importing_the_app_reads_no_environment_and_touches_no_disk(tmp_path: Path) -> None:
    env = {**os.environ, "LOCKSTEP_HOME": str(tmp_path), "LOCKSTEP_COORDINATOR_URL": "not a url"}
    done = subprocess.run([sys.executable, "-c", "import coordinator.stream.app"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_app_follows_the_settings_it_is_given(tmp_path: Path) -> None:
    app = create_app(Settings(home=tmp_path, coordinator_url="http://127.0.0.1:6123", topic_prefix="t1"))
    assert app.conf.id == "t1-coordinator"
    assert (app.conf.web_host, app.conf.web_port) == ("127.0.0.1", 6123)
    assert Path(app.conf.datadir).parent == tmp_path.absolute() / "coordinator"
    assert {"/health", "/state", "/snapshot", "/delays", "/metrics"} <= {route for route in app.web.views}
