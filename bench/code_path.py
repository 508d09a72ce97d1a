"""Which of Lockstep's modules a piece of work passes through, in order: how often it comes back
to a module it already left. A barrier whose maintenance reads top to bottom enters each module
once or twice; one whose helpers call back into a table handed to them ping-pongs.

Each call into a function of ``package`` (a module other than the one just called into) is one
step; a step into a module entered before is a return. Comprehensions are not calls.

Example::

    result, path = traced(lambda: maintainer.process(work))
    print(describe(path))   # 7 modules, 3 returns to a module it left (...): ivm > ways > ...
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")


COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


def traced(work: Callable[[], T], package: str = "spark_jobs.") -> tuple[T, list[str]]:
    """``work()`` and the modules of ``package`` it called into, in order (repeats in a row merged)."""
    path: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        # a comprehension runs in the function that holds it (Python 3.12 inlines them, PEP 709):
        # on 3.11 it is a frame of its own, which would count as coming back to its module
        if event == "call" and frame.f_code.co_name not in COMPREHENSIONS:
            module = frame.f_globals.get("__name__", "")
            if module.startswith(package) and (not path or path[-1] != module):
                path.append(module)

    sys.setprofile(profile)
    try:
        result = work()
    finally:
        sys.setprofile(None)
    return result, path


# helpers every part of a job calls and that call nothing back: a step into one and out is not
# a path coming back (JVM classes, the file system API, the stopwatch, session settings, plans)
UTILITIES = ("spark_jobs.runtime.java", "spark_jobs.runtime.storage", "spark_jobs.runtime.stopwatch",
             "spark_jobs.runtime.session", "spark_jobs.planning.")


def without_utilities(path: list[str]) -> list[str]:
    """``path`` without the steps into ``UTILITIES`` (repeats in a row merged again)."""
    kept: list[str] = []
    for module in path:
        if not module.startswith(UTILITIES) and (not kept or kept[-1] != module):
            kept.append(module)
    return kept


def returns(path: list[str]) -> int:
    """Steps into a module the path had entered before."""
    return sum(1 for i, module in enumerate(path) if module in path[:i])


def describe(path: list[str], package: str = "spark_jobs.") -> str:
    """``N modules, M returns to a module it left: a > b > ...`` without the utilities (module
    names without ``package``), and the count with them."""
    main = without_utilities(path)
    short = [m.removeprefix(package).removeprefix("runtime.").removeprefix("maintenance.") for m in main]
    return (f"{len(set(main))} modules, {returns(main)} returns to a module it left (with the utilities: "
            f"{len(set(path))} modules, {returns(path)} returns): {' > '.join(short)}")
