"""Python pipeline files: decorated functions become maintained tables whose parameters name
the tables they read; a file that cannot be used says why, naming the function. Run by the same
jobs as SQL tables: at every barrier the function's result over its sources' exact points is one
Delta commit, a pandas UDF included, and SQL tables read it as any other table."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from spark_jobs.ops.jobs import register_pipeline
from spark_jobs.planning.pipeline import PipelineError, joined, load_pipeline, parse_pipeline
from spark_jobs.planning.plan import PlanKind
from spark_jobs.planning.plans import explain_job, plan_for
from tests.support import ROOT
from tests.support.barriers import at, wait_for_barrier
from tests.support.supervising import KeyedRecords, Stack, supervised

HEADER = "from spark_jobs.api import pipelines as dp\n\n"


def write(tmp_path: Path, body: str, name: str = "p.py") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + body)
    return path


def test_each_decorated_function_is_a_table_reading_the_tables_its_parameters_name(tmp_path: Path) -> None:
    path = write(tmp_path, '''
@dp.materialized_view
def slow(clicks):
    return clicks.where("ms > 200")

@dp.table(name="pages", comment="joined")
def pages_of(spark, slow, users):
    return slow.join(users, "user")
''')
    pipeline = load_pipeline(path)
    assert [(t.name, t.sources) for t in pipeline.derived] == [("slow", ("clicks",)), ("pages", ("slow", "users"))]
    pages = pipeline.derived[1].python
    assert pages is not None and pages.wants_session and pages.comment == "joined" and pages.origin == "p.py:8"
    assert [(j.job_id, j.sources, j.sql) for j in pipeline.jobs] == [
        ("maintain_slow", ("clicks",), ""), ("maintain_pages", ("slow", "users"), "")]  # no SQL to show
    assert "def pages_of(spark, slow, users)" in pipeline.derived[1].query  # its fingerprint: the code
    plan = plan_for(pipeline, pipeline.derived[0])
    assert not plan.incremental
    assert "Python function slow (p.py:4) reads clicks, which has no key and may change" in explain_job(
        pipeline, pipeline.jobs[0])
    keyed = joined([parse_pipeline("CREATE TABLE clicks (id BIGINT, ms BIGINT) WITH ('source' = 'kafka:c', "
                                   "'primary_key' = 'id');"), pipeline])
    plan = plan_for(keyed, keyed.table("slow"))  # type: ignore[arg-type]
    assert (plan.kind, plan.key) == (PlanKind.ROW_WISE, ("id",))
    assert "replacing the rows of the keys (id) they change" in explain_job(keyed, keyed.jobs[1])


def test_sql_and_python_files_make_one_pipeline(tmp_path: Path) -> None:
    sql = load_pipeline(ROOT / "pipelines" / "clicks.sql")
    python = load_pipeline(ROOT / "pipelines" / "clicks_scored.py")
    whole = joined([sql, python])
    assert [t.name for t in whole.roots] == ["clicks"]
    assert [t.name for t in whole.derived] == ["views_per_page", "scored_clicks", "patience_per_user"]
    assert whole.table("patience_per_user").sources == ("scored_clicks",)  # type: ignore[union-attr]
    kinds = {t.name: plan_for(whole, t).kind for t in whole.derived if t.python is not None}
    # over clicks, which only grows: new rows only (if row-wise); over a Python table: recomputed
    assert kinds == {"scored_clicks": PlanKind.ROW_WISE, "patience_per_user": PlanKind.FULL_REFRESH}
    twice = write(tmp_path, "@dp.materialized_view\ndef views_per_page(clicks):\n    return clicks\n")
    with pytest.raises(PipelineError, match="defined in more than one place: views_per_page"):
        joined([sql, load_pipeline(twice)])
    # a SQL table downstream of a Python one is planned with that table's shape unknown
    downstream = parse_pipeline("CREATE TABLE n AS SELECT user, COUNT(*) AS c FROM scored_clicks GROUP BY user")
    assert plan_for(joined([sql, python, downstream]), downstream.derived[0]).incremental


@pytest.mark.parametrize(("body", "message"), [
    ("@dp.materialized_view\ndef f(*tables):\n    return tables[0]\n", "change tables"),
    ("@dp.materialized_view\ndef f(clicks=None):\n    return clicks\n", "without defaults"),
    ("@dp.materialized_view\ndef f(spark):\n    return spark.range(3)\n", "reads no table: name the tables"),
    ("@dp.materialized_view(name='bad__name')\ndef f(clicks):\n    return clicks\n", "reserved"),
    ("raise RuntimeError('boom')\n", "running it failed: RuntimeError: boom"),
    ("x = 1\n", "defines no table"),
    # what pyspark raises for a UDF typed by a DDL string when no session exists yet
    ("raise RuntimeError('SparkSession should be created first')\n", "the file is loaded without a Spark session"),
])
def test_a_file_that_cannot_be_used_says_why(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(PipelineError, match=message) as error:
        load_pipeline(write(tmp_path, body))
    if "def f" in body:
        assert "p.py:3" in str(error.value)  # where the function is


SQL = """
CREATE TABLE events (k BIGINT, v BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE per_band AS SELECT band, COUNT(*) AS n, SUM(v) AS total FROM scored GROUP BY band;
"""
PYTHON = '''
import pandas as pd
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf
from pyspark.sql.types import DoubleType

from spark_jobs.api import pipelines as dp


@pandas_udf(DoubleType())
def root(v: pd.Series) -> pd.Series:
    return v.pow(0.5)


@pandas_udf(DoubleType())
def picky_root(v: pd.Series) -> pd.Series:
    if (v == 12).any():
        raise ValueError("twelve has no root here")
    return v.pow(0.5)


@dp.materialized_view
def roots(events):  # row-wise over a table that only grows: each barrier's new rows, appended
    return events.where("v % 2 = 0").select("k", "v", picky_root(F.col("v")).alias("r"))


@dp.materialized_view
def scored(spark, events):  # joins a table of its own: recomputed at every barrier
    bands = spark.createDataFrame([(0, "low"), (1, "high")], "big INT, band STRING")
    scored = events.select("k", "v", root(F.col("v")).alias("score"), (F.col("v") > 10).cast("int").alias("big"))
    return scored.join(bands, "big").drop("big")
'''


@pytest.mark.integration
def test_a_python_table_is_its_function_over_each_barriers_exact_points(
    spark: SparkSession, make_stack: Callable[[], Stack], make_topic: Callable, kafka_bootstrap: str, tmp_path: Path,
) -> None:
    topic = make_topic(partitions=1)
    settings = make_stack().settings
    (tmp_path / "scored.py").write_text(PYTHON)
    pipeline = joined([parse_pipeline(SQL.format(topic=topic)), load_pipeline(tmp_path / "scored.py")])
    register_pipeline(settings, pipeline)
    records = KeyedRecords(kafka_bootstrap, topic, value=lambda i: i)
    tables = ["events", "roots", "scored", "per_band"]
    with supervised(spark, pipeline, settings):
        wait_for_barrier(settings, tables, records.send(8), topic)
        state, b = wait_for_barrier(settings, tables, records.send(12), topic)

    points = state.exact_points
    scored = sorted((r["k"], r["v"], r["score"], r["band"]) for r in at(spark, settings, "scored", points("scored")[b]).collect())
    want = sorted((i % 3, i, math.sqrt(i), "high" if i > 10 else "low") for i in range(20))
    assert [(k, v, band) for k, v, _, band in scored] == [(k, v, band) for k, v, _, band in want]
    assert all(math.isclose(got[2], expected[2]) for got, expected in zip(scored, want, strict=True))
    bands: dict[str, list[int]] = defaultdict(list)
    for i in range(20):
        bands["high" if i > 10 else "low"].append(i)
    per_band = {r["band"]: (r["n"], r["total"]) for r in at(spark, settings, "per_band", points("per_band")[b]).collect()}
    assert per_band == {band: (len(vs), sum(vs)) for band, vs in bands.items()}
    roots = sorted((r["k"], r["v"], r["r"]) for r in at(spark, settings, "roots", points("roots")[b]).collect())
    assert roots == [(k, i, pytest.approx(math.sqrt(i))) for k, i in sorted((i % 3, i) for i in range(0, 20, 2) if i != 12)]
    letters = spark.read.format("delta").load(settings.table_location("roots__dlq")).collect()
    dead = [(json.loads(r["row"]), r["error"]) for r in letters]
    assert dead == [({"k": 0, "v": 12}, "ValueError: twelve has no root here")]  # the row it raised on, and why
    modes = {name: [r["operationParameters"]["mode"] for r in DeltaTable.forPath(spark, settings.table_location(name))
                    .history().orderBy("version").collect() if r["operation"] == "WRITE"] for name in ("roots", "scored")}
    assert modes["roots"][0] == "Overwrite" and set(modes["roots"][1:]) == {"Append"}  # the first barrier, then new rows
    assert set(modes["scored"]) == {"Overwrite"}  # not row-wise (a join): recomputed
