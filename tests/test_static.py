"""Static checks the test command runs too: ruff on everything, mypy --strict on the layers every
process shares (rules, files and flags in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mypy import api

from tests.support import ROOT


def test_ruff_finds_nothing() -> None:
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_domain_codec_client_and_settings_type_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # mypy reads [tool.mypy] from the pyproject.toml of the current directory
    out, err, status = api.run(["--cache-dir", str(ROOT / ".mypy_cache")])
    assert status == 0, out + err
