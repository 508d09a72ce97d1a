"""Reading exact offset ranges of a Kafka topic with Spark's batch Kafka source, as every root
job does: a barrier's ``[start, end)`` per partition, read committed.

Example::

    frame = read_ranges(spark, kafka_source_options(settings), "orders", work.offsets)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession

from coordinator.client.topics import SPARK_GROUP
from coordinator.domain.events import OffsetRange
from coordinator.settings import Settings

LATEST = -1  # an offset range's end that reads as far as the partition has records (Kafka's -1)


def kafka_source_options(settings: Settings) -> dict[str, str]:
    """Spark's Kafka source reaches the brokers as every Lockstep client does (the security of
    ``LOCKSTEP_KAFKA_*``), in consumer groups under the topic prefix (one group ACL covers them)."""
    return {"kafka.bootstrap.servers": settings.bootstrap, "groupIdPrefix": settings.topic_prefix + SPARK_GROUP,
            **{f"kafka.{key}": value for key, value in settings.kafka_security.java_properties().items()}}


def read_ranges(spark: SparkSession, options: Mapping[str, str], topic: str,
                ranges: Sequence[OffsetRange]) -> DataFrame | None:
    """The records of ``topic`` in ``ranges`` (others' ranges are ignored); None if there are none to read."""
    wanted = [r for r in ranges if r.topic == topic and (r.end == LATEST or r.end > max(r.start, 0))]
    if not wanted:
        return None
    return (
        spark.read.format("kafka")
        .options(**options)
        .option("assign", json.dumps({topic: sorted(r.partition for r in wanted)}))  # only partitions with data
        .option("startingOffsets", json.dumps({topic: {str(r.partition): r.start for r in wanted}}))
        .option("endingOffsets", json.dumps({topic: {str(r.partition): r.end for r in wanted}}))
        .option("failOnDataLoss", "true")
        # records of aborted transactions are never ingested; the barrier cuts end at the
        # last stable offset too (the coordinator measures them read_committed)
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
