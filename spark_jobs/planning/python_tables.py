"""Pipelines in Python: decorated functions that return DataFrames, each a maintained table.

The decorators follow Spark Declarative Pipelines (``pyspark.pipelines``): ``@materialized_view``
(and ``@table``, the same here: every Lockstep table is maintained barrier by barrier) turns a
function into a table named after it (or ``name=``), with an optional ``comment``. Where SDP's
functions read their inputs with ``spark.read.table("x")``, a Lockstep function names them as
parameters: ``def slow(clicks)`` reads table ``clicks`` (a parameter named ``spark`` gets the
session). So the tables a function reads are known without running it, and each barrier the
job hands it DataFrames of its sources at that barrier's exact points.

A file is run (``runpy``) with the decorators collecting its tables; it needs no Spark to load,
so ``lockstep explain`` stays a check that starts nothing. Its functions run in the job, at
every barrier where a source changed: over each barrier's changed rows where the function is
row-wise over one table that only grows (its new rows, appended) or has a key it keeps (the
changed keys' rows, replaced; ``PlanKind.ROW_WISE``), else over the sources' exact points,
replacing the table; one Delta commit per barrier either way.

Example (``pipelines/clicks_scored.py`` has one with a pandas UDF)::

    from spark_jobs.api import pipelines as dp

    @dp.materialized_view(comment="clicks slower than 200 ms")
    def slow_clicks(clicks):
        return clicks.where("ms > 200")
"""

from __future__ import annotations

import inspect
import runpy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

from coordinator.domain.validity import name_problem

F = TypeVar("F", bound=Callable[..., Any])
SESSION = "spark"  # the parameter that gets the job's SparkSession instead of a table


@dataclass(frozen=True)
class PythonTable:
    """One decorated function: the table it defines and the tables its parameters name."""

    name: str
    function: Callable[..., Any]
    sources: tuple[str, ...]
    wants_session: bool
    comment: str
    origin: str  # file:line of the function, for messages and `lockstep explain`
    source_text: str  # the function's code: its fingerprint (a changed function recomputes its table)


_collected: list[PythonTable] | None = None  # the tables of the file being loaded


def _register(function: Callable[..., Any], name: str | None, comment: str | None) -> None:
    table = name or function.__name__
    where = f"{Path(inspect.getsourcefile(function) or '?').name}:{inspect.getsourcelines(function)[1]}"
    if problem := name_problem("table name", table):
        raise ValueError(f"{where}: {problem}")
    parameters = inspect.signature(function).parameters.values()
    odd = [p.name for p in parameters if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or p.default is not p.empty]
    if odd:
        raise ValueError(f"{where}: {function.__name__}'s parameters name the tables it reads, one each, "
                         f"without defaults or *args: change {', '.join(odd)}")
    sources = tuple(p.name for p in parameters if p.name != SESSION)
    if not sources:
        raise ValueError(f"{where}: {function.__name__} reads no table: name the tables it reads as its parameters, "
                         f"e.g. def {function.__name__}(clicks)")
    if _collected is not None:
        _collected.append(PythonTable(table, function, sources, len(sources) < len(list(parameters)),
                                      comment or "", where, inspect.getsource(function)))


@overload
def materialized_view(function: F, /) -> F: ...
@overload
def materialized_view(*, name: str | None = None, comment: str | None = None) -> Callable[[F], F]: ...
def materialized_view(function: F | None = None, /, *, name: str | None = None,
                      comment: str | None = None) -> F | Callable[[F], F]:
    """Make the decorated function a maintained table (``name``: the function's name by default)."""

    def decorate(f: F) -> F:
        _register(f, name, comment)
        return f

    return decorate(function) if function is not None else decorate


table = materialized_view  # SDP's streaming table: every Lockstep table is maintained per barrier


def load_python_tables(path: Path) -> list[PythonTable]:
    """The tables a Python pipeline file defines, in the order it defines them. Raises
    ValueError naming the file for a file that fails to run or defines no table."""
    global _collected
    _collected = []
    try:
        runpy.run_path(str(path), run_name=f"lockstep_pipeline_{path.stem}")
        found = _collected
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's file: its error, named, is the message
        hint = ("; the file is loaded without a Spark session: use Spark only inside the functions (give a "
                "UDF's return type as a type object, DoubleType(), not as a string)") if "SparkSession" in str(exc) else ""
        raise ValueError(f"running it failed: {type(exc).__name__}: {exc}{hint}") from exc
    finally:
        _collected = None
    if not found:
        raise ValueError("it defines no table: decorate a function with @materialized_view "
                         "(from spark_jobs.api import pipelines as dp; @dp.materialized_view)")
    return found
