from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from coordinator.settings import Settings
from spark_jobs.smoke import run_smoke

pytestmark = [pytest.mark.integration]


def test_smoke_copies_every_record_into_delta(spark: SparkSession, settings: Settings) -> None:
    lines: list[str] = []
    result = run_smoke(settings, records=1200, partitions=2, echo=lines.append)
    assert result.ok, result
    assert result.delta_rows == 1200
    assert result.table_path.startswith(str(settings.warehouse))
    assert any("produced 1200 records" in line for line in lines)
