"""The live page in a real browser (headless Chromium) on a running pipeline: a real worker,
Kafka, and Spark jobs committing Delta tables."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from coordinator.settings import Settings
from spark_jobs.ops.jobs import register_pipeline
from spark_jobs.planning.pipeline import parse_pipeline
from tests.support.barriers import wait_for_barrier
from tests.support.supervising import Stack, supervised

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PIPELINE = """
CREATE TABLE clicks (user_id BIGINT, n BIGINT) WITH ('source' = 'kafka:{topic}', 'format' = 'json');
CREATE MATERIALIZED VIEW per_user AS SELECT user_id, SUM(n) AS total FROM clicks GROUP BY user_id;
"""


def test_the_page_draws_a_running_pipeline_and_keeps_up(
    spark: SparkSession, make_stack: Callable[[], Stack], make_topic: Callable, kafka_bootstrap: str,
    make_browser: Callable, tmp_path: Path,
) -> None:
    topic = make_topic(partitions=1)
    settings = make_stack().settings
    pipeline = parse_pipeline(PIPELINE.format(topic=topic))
    register_pipeline(settings, pipeline)
    with supervised(spark, pipeline, settings):  # as `lockstep run` runs them: per_user in clicks' fused group
        check_page(settings, topic, kafka_bootstrap, make_browser, tmp_path)


def check_page(settings: Settings, topic: str, kafka_bootstrap: str, make_browser: Callable, tmp_path: Path) -> None:
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(20):
        producer.produce(topic, json.dumps({"user_id": i % 4, "n": 1}).encode())
    producer.produce(topic, b"{not json")  # one dead letter
    producer.flush(10)
    wait_for_barrier(settings, ["clicks", "per_user"], {0: 21}, topic)

    browser = make_browser()
    browser.get(settings.coordinator_url + "/")
    wait = WebDriverWait(browser, 60, poll_frequency=0.2)
    # the graph: the topic, both tables, the edges between them
    # the page redraws every second: each read takes what it needs in one step in the page, as a
    # WebDriver element found in one call may be gone by the next (a stale element)
    def texts(css: str) -> list[str]:
        return browser.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent.trim())", css)

    def classes(css: str) -> list[str]:
        return browser.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(e => e.getAttribute('class'))", css)

    wait.until(lambda b: texts("#graph g.table[data-table='per_user']"))
    assert texts("#graph g.topic")[0].startswith(topic)
    assert len(texts("#graph path.edge")) == 2
    assert "RUNNING" in classes("#graph g[data-table='clicks']")[0]
    # per table: a freshness in seconds, and the dead letter counted
    wait.until(lambda b: re.fullmatch(r"\d+\.\d s", (texts("#tables tr[data-table='per_user'] td.freshness") or [""])[0]))
    cells = texts("#tables tr[data-table='clicks'] td")
    assert cells[0] == "clicks" and cells[3] == "RUNNING" and cells[-2] == "every barrier" and cells[-1] == "1", cells
    per_user = texts("#tables tr[data-table='per_user'] td")
    assert per_user[2] == "maintain_per_user (fused with ingest_clicks)", per_user  # its job runs on clicks' commits
    # column lineage, from the SQL the worker holds
    lineage = browser.execute_script("return [...document.querySelectorAll('#columns tbody tr')]"
                                     ".map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent.trim()))")
    assert lineage == [["per_user.user_id", "clicks.user_id"], ["per_user.total", "clicks.n"]], lineage
    # it updates itself: the newest barrier on the timeline moves on, and the plots draw (uPlot canvases)
    # read in the page in one step: the timeline redraws its spans between two WebDriver calls (a stale element)
    newest = lambda b: b.execute_script(  # noqa: E731
        "const s = document.querySelectorAll('#timeline span'); return s.length ? s[s.length - 1].title : null")
    first = newest(browser)
    wait.until(lambda b: newest(b) != first)
    wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".plots canvas")) == 3)
    assert browser.find_element(By.ID, "error").get_attribute("hidden") is not None
    shot = tmp_path / "page.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000

    # the page's files only: nothing outside its folder is served
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(settings.coordinator_url + "/page/..%2Fapp.py", timeout=10)
    assert missing.value.code == 404
