"""Python tables over pipelines/clicks.sql's clicks, with a pandas UDF (docs/pipelines.md).

    lockstep run pipelines/clicks.sql pipelines/clicks_scored.py

Each function names the tables it reads as its parameters and returns a DataFrame; Lockstep
calls it at every barrier where a source changed, with each source at that barrier's exact
point, and commits its result as one Delta version of the table.
"""

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf
from pyspark.sql.types import DoubleType

from spark_jobs.api import pipelines as dp


@pandas_udf(DoubleType())  # a type object, not "double": the file is loaded without a Spark session
def patience(ms: pd.Series) -> pd.Series:
    """A score per click, 1.0 for an instant page, falling as it gets slower (a stand-in for a model)."""
    return 1.0 / (1.0 + ms / 100.0)


@dp.materialized_view(comment="every click with its patience score")
def scored_clicks(clicks: DataFrame) -> DataFrame:
    return clicks.select("user", "page", "ms", patience(F.col("ms")).alias("score"))


@dp.materialized_view(name="patience_per_user")
def per_user(scored_clicks: DataFrame) -> DataFrame:
    return scored_clicks.groupBy("user").agg(F.count(F.lit(1)).alias("clicks"), F.avg("score").alias("avg_score"))
