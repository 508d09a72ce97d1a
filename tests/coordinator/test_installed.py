"""The install record scripts/setup leaves: read, or a clear error when it cannot be."""

from pathlib import Path

import pytest

from coordinator.installed import Installed, InstallRecordError


def test_a_missing_record_is_an_empty_one(tmp_path: Path) -> None:
    assert Installed.read(tmp_path / "none.json") == Installed(record=tmp_path / "none.json")


def test_an_unreadable_install_record_says_which_and_how_to_mend_it(tmp_path: Path) -> None:
    record = tmp_path / "lockstep-install.json"
    record.write_text('{"home": ')
    with pytest.raises(InstallRecordError, match=f"the install record {record} is unreadable .*run scripts/setup again"):
        Installed.read(record)
