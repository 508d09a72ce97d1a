"""Imports run downward only: domain <- codec <- client <- {worker, light reads, data plane} <- lockstep (the CLI).

Each package may import only the layers below it (and itself); the domain imports nothing but
the standard library; no two modules import each other, directly or around a circle. Imports
inside functions count too: a lazy import is still an arrow.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# one typed Settings, read by every layer above the domain, and the fault points drills fire
BASE = ("coordinator.settings", "coordinator.installed", "coordinator.faults")
DATA_PLANE_BASE = ("coordinator.domain", "coordinator.codec", "coordinator.client", "coordinator.spark_sql", *BASE)
# package -> the Lockstep modules it may import (besides itself); None: standard library only
ALLOWED: dict[str, tuple[str, ...] | None] = {
    "coordinator.domain": None,
    "coordinator.settings": ("coordinator.domain", "coordinator.installed"),
    "coordinator.installed": ("coordinator.domain",),  # where scripts/setup put the jars and the home
    "coordinator.faults": ("coordinator.settings",),
    "coordinator.codec": ("coordinator.domain",),
    "coordinator.spark_sql": (),  # the SQL dialect (sqlglot's Spark, amended): every module that parses a query
    # column lineage from SQL (sqlglot): shared by the worker's page and the data plane
    "coordinator.columns": ("coordinator.spark_sql",),
    "coordinator.client": ("coordinator.domain", "coordinator.codec", *BASE),
    "coordinator.stream": ("coordinator.domain", "coordinator.codec", "coordinator.client", "coordinator.columns", *BASE),
    # the local development stack (`lockstep dev`): servers as child processes, beside the CLI that starts them
    "lockstep.dev": ("coordinator.domain.errors", "coordinator.client", *BASE),
    "coordinator.replay": ("coordinator.domain", "coordinator.codec", "coordinator.client", *BASE),
    # consistent reads without Spark (delta-rs, DataFusion): the light path and its Postgres-wire server
    "lockstep_reads": ("coordinator.domain", "coordinator.client", *BASE),
    # a snapshot read by a SparkSession (imported only when one is given): time travel and Spark SQL
    "lockstep_reads.spark": ("coordinator.domain", "coordinator.client", "coordinator.spark_sql", *BASE,
                             "lockstep_reads.statements", "lockstep_reads.tables", "spark_jobs.planning", "spark_jobs.runtime"),
    "spark_jobs": (),  # the package's docstring only
    # the data plane, by audience: planning <- runtime <- ops <- api <- demo
    "spark_jobs.planning": ("coordinator.domain", "coordinator.columns", "coordinator.spark_sql"),
    "spark_jobs.runtime": (*DATA_PLANE_BASE, "spark_jobs.planning"),
    "spark_jobs.ops": (*DATA_PLANE_BASE, "spark_jobs.planning", "spark_jobs.runtime"),
    "spark_jobs.api": (*DATA_PLANE_BASE, "spark_jobs.planning", "spark_jobs.runtime", "spark_jobs.ops",
                       "lockstep_reads"),  # reads have one front door: lockstep_reads.open_snapshot
    "spark_jobs.demo": (*DATA_PLANE_BASE, "spark_jobs.planning", "spark_jobs.runtime", "spark_jobs.ops", "spark_jobs.api",
                        "lockstep_reads"),  # the demo's readers: light by default, Spark to compare
    "lockstep": ("coordinator", "spark_jobs", "lockstep_reads"),  # the composition root: it may import every layer
}
OURS = ("coordinator", "spark_jobs", "lockstep", "lockstep_reads", "bench", "tests")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Absolute module names ``path`` imports, wherever in the file."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            # `from package import module` imports the module too (circles pass through it)
            names.update(f"{node.module}.{alias.name}" for alias in node.names
                         if (ROOT / node.module.replace(".", "/") / alias.name).with_suffix(".py").exists()
                         or (ROOT / node.module.replace(".", "/") / alias.name / "__init__.py").exists())
    return names


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_of(module: str) -> str | None:
    return max((p for p in ALLOWED if within(module, p)), key=len, default=None)


def sources() -> list[Path]:
    packages = ("coordinator", "spark_jobs", "lockstep", "lockstep_reads")
    return sorted(path for package in packages for path in ROOT.glob(f"{package}/**/*.py"))


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_downward(path: Path) -> None:
    module = module_name(path)
    layer = layer_of(module)
    for imported in sorted(imported_modules(path)):
        top = imported.split(".")[0]
        assert within(module, "lockstep") or not within(imported, "lockstep"), \
            f"{module} imports {imported}: nothing imports the CLI package (it composes the rest)"
        if layer is None or top not in OURS:
            if layer is not None and ALLOWED[layer] is None:
                assert top in sys.stdlib_module_names or top == "__future__", \
                    f"{module} imports {imported}: the domain must stay standard-library only"
            continue
        allowed = ALLOWED[layer] or ()
        ok = within(imported, layer) or any(within(imported, a) for a in allowed)
        assert ok, f"{module} imports {imported}: {layer} may import only {', '.join(allowed) or 'the standard library'}"


@pytest.mark.parametrize("path", sorted(ROOT.glob("spark_jobs/planning/*.py")), ids=lambda p: p.name)
def test_planning_needs_no_spark(path: Path) -> None:
    """Pipelines and plans are parsed by `lockstep explain` and checks that must not start a JVM."""
    heavy = [m for m in imported_modules(path) if m.split(".")[0] in ("pyspark", "delta", "py4j")]
    assert heavy == [], f"{module_name(path)} imports {heavy}"


def test_the_rules_see_every_package() -> None:
    """A new package gets a rule: every source module belongs to a layer (the bare namespace excepted)."""
    orphans = [module_name(p) for p in sources() if layer_of(module_name(p)) is None]
    assert orphans == ["coordinator"], orphans


def test_no_module_imports_itself_around_a_circle() -> None:
    modules = {module_name(p): p for p in sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = set()
        for imported in imported_modules(path):
            if imported in modules and imported != name:
                graph[name].add(imported)
    on_path: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        if name in on_path:
            cycle = on_path[on_path.index(name):] + [name]
            raise AssertionError("import circle: " + " -> ".join(cycle))
        if name in done:
            return
        on_path.append(name)
        for target in sorted(graph[name]):
            visit(target)
        on_path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def test_tests_mirror_the_packages() -> None:
    """tests/<package path>/test_<module>.py tests <package path>/<module>.py; drills, Kafka/Spark
    behaviour checks and shared helpers have folders of their own."""
    own_folders = ("drills", "integration", "support")
    strays = []
    for test in sorted((ROOT / "tests").rglob("test_*.py")):
        relative = test.relative_to(ROOT / "tests")
        if relative.parts[0] in own_folders or len(relative.parts) == 1:
            continue
        target = ROOT / relative.parent / relative.stem.removeprefix("test_")
        if not (target.with_suffix(".py").exists() or target.is_dir()):
            strays.append(str(relative))
    assert strays == []
