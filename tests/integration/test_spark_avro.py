"""spark-avro (the 4.1.1 jar standing in for 4.2.0) round-trips records on Spark 4.2."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro, to_avro

pytestmark = [pytest.mark.integration]

SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Shopping",
        "fields": [{"name": "user_id", "type": "long"}, {"name": "price", "type": "double"}],
    }
)


def test_to_avro_then_from_avro_returns_the_same_rows(spark: SparkSession) -> None:
    rows = spark.createDataFrame([(1, 2.5), (2, 4.0)], "user_id BIGINT, price DOUBLE")
    encoded = rows.select(to_avro(F.struct("user_id", "price"), SCHEMA).alias("value"))
    decoded = encoded.select(from_avro("value", SCHEMA).alias("r")).select("r.*")
    assert sorted(map(tuple, decoded.collect())) == [(1, 2.5), (2, 4.0)]
