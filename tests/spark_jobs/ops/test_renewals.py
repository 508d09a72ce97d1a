"""Renewals keep a pending CTAS table alive from registration on (before Spark starts), for the
jobs not forgotten, until closed; then the leader's proposal to drop it goes through."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from coordinator.client.commands import CommandClient, new_request_id
from coordinator.client.state import read_state
from coordinator.domain import DeclareTable, RegisterJob
from coordinator.settings import Settings
from spark_jobs.ops.renewals import Renewals
from tests.support import wait_until

pytestmark = [pytest.mark.integration]


def test_renewals_keep_pending_tables_of_live_jobs_and_stop_when_closed(
    make_worker: Callable, coordinator_env: dict[str, str],
) -> None:
    coordinator_env["LOCKSTEP_JOB_LIVENESS_MS"] = "1000"  # a pending table silent for 2 s is dropped
    worker = make_worker()
    settings = Settings.from_env({**coordinator_env, "LOCKSTEP_COORDINATOR_URL": worker.url})
    client = CommandClient(settings)
    try:
        for command in (DeclareTable(new_request_id(), "src", "root"),
                        DeclareTable(new_request_id(), "kept", "intermediate", ctas=True),
                        DeclareTable(new_request_id(), "forgotten", "intermediate", ctas=True),
                        RegisterJob(new_request_id(), "make_kept", "kept", sources=("src",)),
                        RegisterJob(new_request_id(), "make_forgotten", "forgotten", sources=("src",))):
            assert client.emit(command).accepted
    finally:
        client.close()
    reports: list[str] = []
    renewals = Renewals(settings, ["make_kept", "make_forgotten", "not_registered"], reports.append).start()
    try:
        renewals.forget("make_forgotten")  # as the runner does for a job it stopped
        time.sleep(8)  # four times what the leader waits for a sign of life
        state = read_state(settings)
        assert "kept" in state.pending() and state.jobs["make_kept"].status == "RUNNING"
        assert "forgotten" not in state.tables and state.jobs["make_forgotten"].status == "FAILED"
        assert renewals.sent >= 8 and reports == []  # a job id unknown to the coordinator is not renewed
    finally:
        renewals.close()
    wait_until(lambda: "kept" not in read_state(settings).tables, "the table dropped once renewals stopped", 30)
