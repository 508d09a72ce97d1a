"""CONTRIBUTING's map of the tree ("Layout") matches the tree: every folder and module it names
exists, and every module of the packages is named in the entry of its folder (or of the nearest
folder above it that has an entry), so a newcomer finds each file where the map says it is."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("coordinator", "lockstep", "lockstep_reads", "spark_jobs")
ENTRY = re.compile(r"^( {0,8})(\.?[\w.-]+(?:/[\w.-]+)*/?)(?:\s|$)")


@dataclass
class Entry:
    path: str  # relative to the root, a folder ends in "/"
    depth: int
    text: list[str] = field(default_factory=list)  # its own line's words and the lines that continue it


def layout() -> list[Entry]:
    """The entries of CONTRIBUTING's Layout block, each with its full path and its own text."""
    doc = (ROOT / "CONTRIBUTING.md").read_text()
    block = doc.split("## Layout", 1)[1].split("```", 2)[1]
    entries: list[Entry] = []
    for line in block.splitlines()[1:]:
        match = ENTRY.match(line)
        if match and len(match[1]) < 10:
            depth = len(match[1]) // 2
            parents = [e for e in entries if e.depth < depth and e.path.endswith("/")]
            parent = next((e for e in reversed(parents) if e.depth == depth - 1), None) if depth else None
            entries.append(Entry((parent.path if parent else "") + match[2], depth, [line[match.end():]]))
        elif entries:
            entries[-1].text.append(line)
    return entries


def section(entries: list[Entry], entry: Entry) -> str:
    """An entry's text with the text of every entry below it."""
    return " ".join(" ".join(e.text) for e in entries if e.path.startswith(entry.path))


def test_every_entry_of_the_map_exists() -> None:
    missing = [e.path for e in layout() if not (ROOT / e.path).exists()]
    assert missing == [], f"CONTRIBUTING's layout names what is not in the tree: {missing}"


def test_every_module_and_folder_is_in_the_map_where_it_lives() -> None:
    entries = layout()
    by_path = {e.path: e for e in entries}
    unnamed = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" in path.parts or path.name == "__init__.py":
                continue
            relative = path.relative_to(ROOT)
            if str(relative) in by_path:
                continue
            folders = [f"{'/'.join(relative.parts[:i])}/" for i in range(len(relative.parts) - 1, 0, -1)]
            home = next(by_path[f] for f in folders if f in by_path)
            text = section(entries, home)
            # the module, and each folder between it and the entry, named in the entry's text
            below = [f.rsplit("/", 2)[-2] + "/" for f in folders[:folders.index(home.path)]]
            for name in [path.name, *below]:
                if not re.search(rf"(?<![\w/]){re.escape(name)}", text):
                    unnamed.append(f"{relative} ({name} under {home.path})")
    assert unnamed == [], "CONTRIBUTING's layout does not name: " + "; ".join(sorted(set(unnamed)))


def test_every_module_the_map_names_is_in_its_folder() -> None:
    entries = layout()
    stale = []
    for entry in entries:
        if not entry.path.endswith("/"):
            continue
        for name in re.findall(r"(?<![\w/.])(\w+\.py)\b", " ".join(entry.text)):
            if not any((ROOT / entry.path).rglob(name)):
                stale.append(f"{name} in {entry.path}")
    assert stale == [], f"CONTRIBUTING's layout names modules that are not there: {stale}"
