"""The code path a piece of work takes through our modules: steps, returns, utilities left out."""

from __future__ import annotations

from bench.code_path import describe, returns, traced, without_utilities


def test_a_path_counts_each_step_into_a_module_it_left_before() -> None:
    path = ["a.ivm", "a.ways", "a.table", "a.ways", "a.table", "a.commits"]
    assert returns(path) == 2  # back to ways, back to table
    assert returns(["a.ivm", "a.ways", "a.table", "a.commits"]) == 0


def test_utilities_are_left_out_and_the_steps_either_side_merge() -> None:
    path = ["spark_jobs.runtime.ivm", "spark_jobs.runtime.stopwatch", "spark_jobs.runtime.ivm",
            "spark_jobs.planning.plan", "spark_jobs.runtime.maintenance.ways", "spark_jobs.runtime.java",
            "spark_jobs.runtime.maintenance.ways"]
    assert without_utilities(path) == ["spark_jobs.runtime.ivm", "spark_jobs.runtime.maintenance.ways"]
    assert describe(path).startswith("2 modules, 0 returns to a module it left (with the utilities: 5 modules, 2 "
                                     "returns): ivm > ways")


def test_tracing_records_the_modules_called_into_in_order() -> None:
    from bench import results  # a module of this package with functions to call

    def work() -> int:
        results.add_json_flag(__import__("argparse").ArgumentParser())
        return 7

    value, path = traced(work, package="bench.")
    assert value == 7 and path == ["bench.results"]



def test_a_comprehension_is_not_a_step_back_into_its_module() -> None:
    # two modules of a package "pkg": a.f calls b.g, then runs a comprehension of its own
    a: dict = {"__name__": "pkg.a"}
    b: dict = {"__name__": "pkg.b"}
    exec("def g():\n    return 2\n", b)
    exec("def f(g):\n    n = g()\n    return [i * n for i in range(3)]\n", a)
    value, path = traced(lambda: a["f"](b["g"]), package="pkg.")
    assert value == [0, 2, 4] and path == ["pkg.a", "pkg.b"] and returns(path) == 0
