"""The shopping generator: a steady rate of purchases whose price is amount x unit price."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient

from coordinator.settings import Settings
from lockstep.cli import cli
from spark_jobs.demo.datagen import RateGenerator, ensure_topic, purchases, unit_price
from tests.support import ROOT, wait_until

pytestmark = [pytest.mark.integration]


def test_purchases_arrive_at_the_rate_with_fixed_unit_prices(settings: Settings, read_topic: Callable) -> None:
    topic = f"shop-{uuid.uuid4().hex[:8]}"
    assert ensure_topic(settings, topic, partitions=2)
    assert not ensure_topic(settings, topic, partitions=2)  # already there
    lines: list[str] = []
    before = int(time.time() * 1000)
    generator = RateGenerator(settings, topic, rate=400, make=purchases(users=7, items=5))
    sent = generator.run(threading.Event(), seconds=2.5, progress=lines.append, every=1.0)
    assert generator.failed == 0
    assert 800 <= sent <= 1000  # 2.5 s at 400/s, give or take one step
    records = read_topic(topic)
    assert len(records) == sent
    assert {p for p, *_ in records} == {0, 1}
    for _, _, key, value in records:
        r = json.loads(value)
        assert int(key) == r["user_id"] < 7 and 0 <= r["item_id"] < 5 and 1 <= r["amount"] <= 5
        assert r["price"] == r["amount"] * unit_price(r["item_id"])
        assert before <= r["ts"] <= int(time.time() * 1000)  # the produce time
    assert any(line.startswith("sent ") and "target 400/s" in line for line in lines)


def test_datagen_command(lockstep_cli: Callable, read_topic: Callable) -> None:
    topic = f"shop-{uuid.uuid4().hex[:8]}"
    done = lockstep_cli("datagen", "shopping", "--rate", "300", "--seconds", "1", "--topic", topic, "--partitions", "1")
    assert done.returncode == 0, done.stderr
    assert f"created topic {topic} (1 partitions)" in done.stdout
    sent = int(done.stdout.split("sent ")[-1].split(" purchases")[0].replace(",", ""))
    assert sent == len(read_topic(topic)) > 0
    bad = lockstep_cli("datagen", "shopping", "--rate", "0")
    assert bad.returncode == 2 and "--rate" in bad.stderr


def test_datagen_lines_sends_each_json_line_keyed_and_a_bad_line_sends_nothing(
        coordinator_env: dict[str, str], read_topic: Callable, kafka_bootstrap: str) -> None:
    topic, refused = f"lines-{uuid.uuid4().hex[:8]}", f"lines-{uuid.uuid4().hex[:8]}"
    lines = '{"user": "ann", "page": "/home"}\n\n{"user": 7, "page": "/cart"}\n'
    done = CliRunner().invoke(cli, ["datagen", "lines", topic, "--key", "user", "--partitions", "1"], input=lines,
                              env=coordinator_env, prog_name="lockstep")
    assert done.exit_code == 0, done.output
    assert f"sent 2 records to {topic}" in done.output
    assert [(key, json.loads(value)) for *_, key, value in read_topic(topic)] == [
        (b"ann", {"user": "ann", "page": "/home"}), (b"7", {"user": 7, "page": "/cart"})]
    bad = CliRunner().invoke(cli, ["datagen", "lines", refused], input='{"user": "ann"}\nuser=bob\n',
                             env=coordinator_env, prog_name="lockstep")
    assert bad.exit_code == 2
    assert "error: line 2 is not JSON" in bad.output and "one JSON object per line" in bad.output
    assert refused not in AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics


def test_datagen_lines_without_a_broker_says_so_in_one_line(coordinator_env: dict[str, str]) -> None:
    env = {**coordinator_env, "LOCKSTEP_BOOTSTRAP": "127.0.0.1:1"}  # nothing listens there
    done = CliRunner().invoke(cli, ["datagen", "lines", "clicks"], input='{"user": "ann"}\n', env=env,
                              prog_name="lockstep")
    assert done.exit_code == 3, done.output
    assert "error: cannot list the topics on 127.0.0.1:1" in done.output and "is the broker up" in done.output
    assert "Traceback" not in done.output


def test_datagen_nexmark_makes_people_auctions_and_bids_that_name_what_came_before(
        lockstep_cli: Callable, read_topic: Callable) -> None:
    prefix = f"nx{uuid.uuid4().hex[:8]}"
    done = lockstep_cli("datagen", "nexmark", "--rate", "500", "--seconds", "1", "--prefix", prefix, "--partitions", "1")
    assert done.returncode == 0, done.stderr
    events = {kind: [json.loads(v) for *_, v in read_topic(f"{prefix}_{kind}")] for kind in ("person", "auction", "bid")}
    sent = int(done.stdout.split("sent ")[-1].split(" events")[0].replace(",", ""))
    assert sum(map(len, events.values())) == sent >= 400
    assert len(events["bid"]) > 10 * len(events["auction"]) > 0 and len(events["auction"]) >= len(events["person"])
    people, auctions = {p["id"] for p in events["person"]}, {a["id"] for a in events["auction"]}
    assert {a["seller"] for a in events["auction"]} <= people and {b["bidder"] for b in events["bid"]} <= people
    assert {b["auction"] for b in events["bid"]} <= auctions and all(b["price"] >= 100 for b in events["bid"])
    assert all(a["date_time"] < a["expires"] and 10 <= a["category"] <= 14 for a in events["auction"])


def test_ctrl_c_flushes_what_was_made_and_exits_130(coordinator_env: dict[str, str], read_topic: Callable) -> None:
    topic = f"shop-{uuid.uuid4().hex[:8]}"
    generator = subprocess.Popen([sys.executable, "-m", "lockstep", "datagen", "shopping", "--rate", "200", "--topic", topic],
                                 env=coordinator_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(generator.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    wait_until(lambda: generator.poll() is not None or any(line.startswith("producing ") for line in lines), "producing", 60)
    time.sleep(1)
    generator.send_signal(signal.SIGINT)
    assert generator.wait(60) == 130, "".join(lines)
    reader.join(10)
    out = "".join(lines)
    sent = int(out.split("sent ")[-1].split(" purchases")[0].replace(",", ""))
    assert sent == len(read_topic(topic)) > 0 and "interrupted" in out  # everything made was flushed first
