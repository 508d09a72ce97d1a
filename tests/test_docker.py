"""docker/ kept true without a Docker engine (none runs here): the compose file's Lockstep
services run commands the CLI has, with variables Settings reads; the servers they start are
the ones the local stack runs; every long-running service has a healthcheck and a restart
policy, and what a service waits for can be waited for; the image gets what the demo needs."""

from __future__ import annotations

import re
from typing import Any

import yaml

from lockstep.cli.root import cli
from lockstep.dev.s3 import MAIN_CLASS as S3_MAIN
from lockstep.dev.spark import MASTER_CLASS, WORKER_CLASS
from tests.support import ROOT

COMPOSE = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
OURS = {name: s for name, s in SERVICES.items() if s.get("build", {}).get("dockerfile") == "docker/Dockerfile"}
KNOWN = set(re.findall(r"LOCKSTEP_[A-Z0-9_]+", (ROOT / "coordinator" / "settings.py").read_text()))


def test_every_lockstep_service_runs_a_command_the_cli_has() -> None:
    assert {"coordinator", "demo", "s3", "spark-master", "spark-worker"} <= set(OURS)
    for name, service in OURS.items():
        if "entrypoint" in service:
            continue
        command = service["command"]
        context = cli.make_context("lockstep", list(command), resilient_parsing=True)
        assert command[0] in cli.commands, f"{name}: lockstep has no command {command[0]!r}"
        sub = cli.commands[command[0]]
        sub.make_context(command[0], list(command[1:]), parent=context)  # its options parse


def test_servers_are_the_ones_the_local_stack_runs() -> None:
    assert S3_MAIN in " ".join(SERVICES["s3"]["entrypoint"])
    assert MASTER_CLASS in SERVICES["spark-master"]["entrypoint"] and WORKER_CLASS in SERVICES["spark-worker"]["entrypoint"]
    spark_class = SERVICES["spark-master"]["entrypoint"][0]
    assert spark_class.endswith("site-packages/pyspark/bin/spark-class")  # the wheel's, as `lockstep dev up` uses
    assert (ROOT / "docker" / "s3proxy.properties").exists()


def test_every_variable_is_a_known_setting_and_the_demo_uses_the_compose_coordinator() -> None:
    for name, service in OURS.items():
        unknown = {k for k in service.get("environment", {}) if k.startswith("LOCKSTEP_") and k not in KNOWN}
        assert not unknown, f"{name}: {unknown} are not settings (coordinator/settings.py)"
    demo = SERVICES["demo"]["environment"]
    assert demo["LOCKSTEP_COORDINATOR_URL"] == "http://coordinator:6066"
    assert demo["LOCKSTEP_WAREHOUSE"].startswith("s3a://") and demo["LOCKSTEP_S3_ENDPOINT"] == "http://s3:9000"
    assert SERVICES["coordinator"]["environment"]["LOCKSTEP_COORDINATOR_URL"] == "http://coordinator:6066"


def test_services_are_checked_restarted_and_waited_for() -> None:
    for name, service in SERVICES.items():
        assert "restart" in service, f"{name} has no restart policy"
        if name != "demo":  # the demo ends by itself
            assert "healthcheck" in service, f"{name} has no healthcheck"
        for needed, how in service.get("depends_on", {}).items():
            assert needed in SERVICES and "healthcheck" in SERVICES[needed], f"{name} waits for {needed}"
            assert how == {"condition": "service_healthy"}


def test_the_image_gets_the_sources_the_demo_needs_and_nothing_local() -> None:
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    copied = re.findall(r"^COPY (\S+)", dockerfile, flags=re.MULTILINE)
    for source in ("coordinator", "spark_jobs", "lockstep", "pipelines", "schemas", "scripts"):
        assert source in copied, f"the image lacks {source}/"
    assert all((ROOT / c).exists() for c in copied)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".lockstep", ".venv", ".git"} <= set(ignored)  # hundreds of MB of jars stay out of the build context
