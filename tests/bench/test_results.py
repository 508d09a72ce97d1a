"""--json: a bench's figures as data, traceable to the command, commit and machine."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.results import Figures, add_json_flag


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.x", exit_on_error=False)
    parser.add_argument("--rounds", type=int, default=3)
    add_json_flag(parser)
    return parser.parse_args(list(argv))


def test_the_figures_are_written_with_their_baseline_ratio_spread_and_what_they_were_measured_on(tmp_path: Path) -> None:
    args = parse("--rounds", "5", "--json", str(tmp_path / "out.json"))
    figures = Figures("x", args)
    figures.add_median("read p50", [9.0, 7.0, 8.0], "ms", baseline=160.0, path="light")
    figures.add("full / kept", 1.0, "s", ratio=2.2)
    figures.add_median("nothing measured", [], "ms")
    assert figures.write() == tmp_path / "out.json"

    record = json.loads((tmp_path / "out.json").read_text())
    assert record["bench"] == "x" and record["args"]["rounds"] == 5
    assert record["commit"] and record["machine"]["cores"] >= 1 and record["started"] <= record["finished"]
    read, ratio = record["figures"]
    assert (read["value"], read["min"], read["max"], read["n"], read["ratio"]) == (8.0, 7.0, 9.0, 3, 20.0)
    assert read["context"] == {"path": "light"}
    assert ratio["ratio"] == 2.2 and ratio["baseline"] is None


def test_without_the_flag_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    figures = Figures("x", parse())
    figures.add("a", 1.0, "s")
    assert figures.write() is None and not list(tmp_path.iterdir())


@pytest.mark.parametrize(("target", "message"), [("missing/out.json", "does not exist; create it first"),
                                                 (".", "is a folder")])
def test_a_json_path_that_cannot_be_written_is_refused_before_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      target: str, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(argparse.ArgumentError, match=message):
        parse("--json", target)
