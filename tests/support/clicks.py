"""A small pipeline for read tests: clicks from Kafka and an aggregate over them with bookkeeping
columns (AVG's sums and counts) and a COUNT(DISTINCT); loaded as a pytest plugin."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from coordinator.settings import Settings
from tests.support.barriers import wait_for_barrier

PIPELINE = """
CREATE TABLE clicks (user STRING, page STRING, ms BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE TABLE per_page AS
  SELECT page, COUNT(*) AS views, COUNT(DISTINCT user) AS users, AVG(ms) AS avg_ms FROM clicks GROUP BY page;
"""
TABLES = ["clicks", "per_page"]


class Clicks:
    """Sends clicks {user, page, ms}: users u0-u6, pages /p0-/p2, ms the click's number."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic, self.sent = topic, 0
        self.producer = Producer({"bootstrap.servers": bootstrap})

    def send(self, n: int) -> dict[int, int]:
        for _ in range(n):
            i = self.sent
            self.producer.produce(self.topic, json.dumps({"user": f"u{i % 7}", "page": f"/p{i % 3}", "ms": i}).encode())
            self.sent += 1
        self.producer.flush(10)
        return {0: self.sent}

    def settle(self, settings: Settings, n: int) -> None:
        """Send ``n`` more and wait until both tables have a common exact point with all of them."""
        wait_for_barrier(settings, TABLES, self.send(n), self.topic)


@pytest.fixture
def clicks_pipeline(run_pipeline: Callable, make_topic: Callable, kafka_bootstrap: str) -> tuple[Settings, Clicks]:
    """The pipeline running (its jobs in the test session's Spark), 40 clicks in both tables."""
    topic = make_topic(partitions=1)
    settings = run_pipeline(PIPELINE.format(topic=topic))
    clicks = Clicks(kafka_bootstrap, topic)
    clicks.settle(settings, 40)
    return settings, clicks
