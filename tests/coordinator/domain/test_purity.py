"""coordinator/domain/ imports only the standard library (and itself)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import coordinator.domain

DOMAIN = Path(coordinator.domain.__file__).parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_domain_imports_only_the_standard_library() -> None:
    files = sorted(DOMAIN.glob("*.py"))
    assert files
    for path in files:
        for module in imported_modules(path):
            top = module.split(".")[0]
            allowed = top in sys.stdlib_module_names or top == "__future__" or module.startswith("coordinator.domain")
            assert allowed, f"{path.name} imports {module}: the domain must stay standard-library only"
