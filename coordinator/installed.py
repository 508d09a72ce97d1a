"""Where ``scripts/setup`` put the jars and the local state, as it recorded them in the
virtualenv it installed into (``.venv/lockstep-install.json``), so ``lockstep`` finds them from
any folder. ``Settings.from_env`` reads it; LOCKSTEP_HOME and LOCKSTEP_JARS override it.

Example::

    installed = Installed.read()     # Installed(home=PosixPath('/src/lockstep/.lockstep'), jars=..., record=...)
    raise SetupError(f"no Delta jars in {folder}. {installed.where_jars()}")
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from coordinator.domain.errors import UsageError


class InstallRecordError(UsageError, ValueError):
    """The install record cannot be read; the message names it and how to mend it."""


INSTALL_RECORD = Path(sys.prefix) / "lockstep-install.json"  # scripts/setup writes it beside the venv's Python


@dataclass(frozen=True)
class Installed:
    """Where ``scripts/setup`` put the jars and the local state (``home``), as it recorded them in
    the virtualenv it installed into: ``lockstep`` finds them from any folder. LOCKSTEP_JARS and
    LOCKSTEP_HOME override them; with no record (a plain ``pip install``) both are under
    ``./.lockstep``."""

    home: Path | None = None
    jars: Path | None = None
    record: Path = INSTALL_RECORD

    @classmethod
    def read(cls, record: Path = INSTALL_RECORD) -> Installed:
        """The record at ``record``, or an empty one if there is none."""
        try:
            data = json.loads(record.read_text())
            return cls(Path(data["home"]), Path(data["jars"]), record)
        except FileNotFoundError:
            return cls(record=record)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InstallRecordError(f"the install record {record} is unreadable ({e}); run scripts/setup again, "
                                "or set LOCKSTEP_HOME and LOCKSTEP_JARS") from None

    def where_jars(self, env: Mapping[str, str] | None = None) -> str:
        """How ``lockstep`` finds its jars and how to point it elsewhere: for a missing-jars error."""
        named = (os.environ if env is None else env).get("LOCKSTEP_JARS")
        recorded = (f"where scripts/setup put them ({self.jars}, recorded in {self.record})" if self.jars is not None
                    else f"./.lockstep/jars of the current folder (there is no install record {self.record})")
        if named:
            return (f"LOCKSTEP_JARS={named} names that folder; unset it to use {recorded}, or run scripts/setup "
                    "with LOCKSTEP_JARS set to fill it.")
        return (f"Without LOCKSTEP_JARS the jars are {recorded}. Run scripts/setup in the checkout (it records "
                "where it puts them), or set LOCKSTEP_JARS to the folder that holds kafka/ and spark/.")
