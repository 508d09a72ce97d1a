"""The root of ``lockstep``: one error policy (message + exit code) for every command."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from coordinator.domain.errors import ExitCode, LockstepError, NotStarted, Rejected, Unreachable, UsageError
from lockstep import signals
from lockstep.cli import EXIT_CODES, LockstepGroup, cli
from lockstep.dev.broker import free_port
from tests.support import ROOT


def invoke(*args: str, env: dict[str, str] | None = None) -> click.testing.Result:
    return CliRunner().invoke(cli, list(args), env=env, prog_name="lockstep")


@pytest.mark.parametrize(("error", "code", "label"), [
    (LockstepError("it failed"), 1, "error"),
    (Rejected("no such job"), 1, "rejected"),
    (UsageError("bad flag"), 2, "error"),
    (Unreachable("nobody at :1"), 3, "error"),
    (NotStarted("no jars"), 4, "error"),
    (KeyboardInterrupt(), 130, None),
])
def test_errors_become_a_message_and_their_exit_code(error: BaseException, code: int, label: str | None) -> None:
    group = LockstepGroup("lockstep")

    @group.command()
    def boom() -> None:
        raise error

    result = CliRunner().invoke(group, ["boom"])
    assert result.exit_code == code
    assert result.stderr.strip() == (f"{label}: {error}" if label else "interrupted")


@pytest.mark.parametrize(("signalled", "code", "said"), [
    ([signal.SIGINT], 130, "interrupted"),
    ([signal.SIGTERM], 143, "terminated"),
    ([], 1, ""),  # no signal came: the error is a bug, shown as one
])
def test_an_error_a_signal_turned_into_another_still_stops_as_that_signal(
        monkeypatch: pytest.MonkeyPatch, signalled: list[int], code: int, said: str) -> None:
    """confluent-kafka can lose the KeyboardInterrupt of a Ctrl-C that lands in a delivery
    callback and raise SystemError instead: after a signal the command still stops as it asked."""
    monkeypatch.setattr(signals, "_received", signalled)
    group = LockstepGroup("lockstep")

    @group.command()
    def boom() -> None:
        raise SystemError("<method 'flush' of 'cimpl.Producer' objects> returned NULL without setting an exception")

    result = CliRunner().invoke(group, ["boom"])
    assert result.exit_code == code and result.stderr.strip() == said
    assert isinstance(result.exception, SystemExit if signalled else SystemError)


def test_version_prints_the_installed_package_version_without_reading_settings() -> None:
    result = invoke("--version", env={"LOCKSTEP_BARRIER_INTERVAL_MS": "not a number"})
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"lockstep {version('lockstep-etl')}"


def test_every_exit_code_is_documented_in_help() -> None:
    shown = invoke("--help")
    assert shown.exit_code == 0
    assert set(EXIT_CODES) == set(ExitCode)
    for code, what in EXIT_CODES.items():
        assert f"{code.value:<4}{what}" in shown.output


@pytest.mark.parametrize("args", [
    ("stop", "some_job"),
    ("emit", "--timeout", "1", "release-lease", "lease-1"),
    ("acls", "job", "User:etl", "--apply"),
    ("dev", "status"),
], ids=" ".join)
def test_a_bad_setting_is_a_usage_error_naming_the_variable(args: tuple[str, ...]) -> None:
    """Commands that talk to Kafka refuse a malformed LOCKSTEP_BOOTSTRAP before doing anything."""
    result = invoke(*args, env={"LOCKSTEP_BOOTSTRAP": "nohost", "LOCKSTEP_COORDINATOR_URL": f"http://127.0.0.1:{free_port()}"})
    assert result.exit_code == 2, result.output
    assert result.stderr == "error: LOCKSTEP_BOOTSTRAP='nohost' is not host:port; set it like LOCKSTEP_BOOTSTRAP=127.0.0.1:9092\n"
    assert result.stdout == ""


@pytest.mark.parametrize(("args", "code", "says"), [
    (("explain", str(ROOT / "pipelines" / "shopping.sql")), 0, "ingest_shopping -> shopping"),
    (("explain", "--help"), 0, "PIPELINE_FILE"),
    (("run", "--help"), 0, "PIPELINE_FILES"),  # help is never refused for settings it does not use
    (("datagen", "lines", "-h"), 0, "TOPIC"),
    (("acls", "job", "User:etl", "--data-topic", "orders"), 0, "orders"),
    (("topology",), 3, "coordinator not reachable"),  # past the settings: only the coordinator is missing
    (("delays",), 3, "coordinator not reachable"),
], ids=["explain", "explain --help", "run --help", "datagen lines -h", "acls", "topology", "delays"])
def test_commands_that_never_reach_kafka_ignore_its_settings(args: tuple[str, ...], code: int, says: str) -> None:
    env = {"LOCKSTEP_BOOTSTRAP": "nonsense", "LOCKSTEP_KAFKA_SECURITY_PROTOCOL": "bogus",
           "LOCKSTEP_COORDINATOR_URL": f"http://127.0.0.1:{free_port()}"}
    result = invoke(*args, env=env)
    assert result.exit_code == code, result.output
    assert says in result.output
    assert "LOCKSTEP_BOOTSTRAP" not in result.stderr and "LOCKSTEP_KAFKA" not in result.stderr


def test_commands_that_never_reach_kafka_still_check_every_other_setting() -> None:
    result = invoke("explain", str(ROOT / "pipelines" / "shopping.sql"), env={"LOCKSTEP_BARRIER_INTERVAL_MS": "1s"})
    assert result.exit_code == 2
    assert result.stderr == "error: LOCKSTEP_BARRIER_INTERVAL_MS='1s' must be a whole number >= 1\n"


def every_command(command: click.Command, path: tuple[str, ...] = ("lockstep",)) -> Iterator[tuple[str, click.Command]]:
    """``(path, command)`` for the root and every command and group under it."""
    yield " ".join(path), command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from every_command(sub, (*path, name))


def test_every_option_has_help_and_every_argument_is_described() -> None:
    """``--help`` says what each option does; click arguments have no help, so the docstring names them."""
    commands = dict(every_command(cli))
    assert {"lockstep query", "lockstep emit acquire-lease", "lockstep barriers tail", "lockstep dev up"} <= set(commands)
    no_help = [f"{path} {param.opts[-1]}" for path, command in commands.items() for param in command.params
               if isinstance(param, click.Option) and not (param.help or "").strip()]
    assert no_help == []
    undescribed = [f"{path} {param.human_readable_name}" for path, command in commands.items() for param in command.params
                   if isinstance(param, click.Argument) and param.human_readable_name not in (command.help or "")]
    assert undescribed == []


def test_help_points_at_the_docs_not_at_readme_sections() -> None:
    assert "(see docs/configuration.md)" in " ".join(invoke("--help").output.split())
    texts = [text for _, command in every_command(cli) for text in (command.help or "", *(
        param.help or "" for param in command.params if isinstance(param, click.Option)))]
    assert [text for text in texts if "README" in text] == []


def test_an_unreachable_coordinator_exits_3_and_says_where() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = invoke("delays", env={"LOCKSTEP_COORDINATOR_URL": url})
    assert result.exit_code == 3
    assert f"coordinator not reachable at {url}/delays" in result.stderr


def test_a_bad_pipeline_file_is_a_usage_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sql"
    bad.write_text("DROP TABLE t;")
    result = invoke("explain", str(bad))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {bad}: ") and "only CREATE TABLE" in result.stderr


def test_explain_makes_one_pipeline_of_sql_and_python_files_and_says_how_each_table_is_kept() -> None:
    result = invoke("explain", str(ROOT / "pipelines" / "clicks.sql"), str(ROOT / "pipelines" / "clicks_scored.py"))
    assert result.exit_code == 0, result.output
    assert "maintain_scored_clicks -> scored_clicks: incremental row-wise: each barrier's new rows of clicks" in result.output
    assert "maintain_patience_per_user -> patience_per_user: full refresh" in result.output
    assert "columns: those scored_clicks returns (clicks_scored.py:25): every click with its patience score" in result.output
    assert "fused group of ingest_clicks: maintain_views_per_page, maintain_scored_clicks, maintain_patience_per_user" \
        in result.output


def test_explain_starts_no_spark() -> None:
    probe = ("import sys; from click.testing import CliRunner; from lockstep.cli import cli; "
             "r = CliRunner().invoke(cli, ['explain', 'pipelines/shopping.sql']); "
             "assert r.exit_code == 0, r.output; print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_commands_that_print_data_print_json_for_scripts(tmp_path: Path) -> None:
    explained = invoke("explain", str(ROOT / "pipelines" / "shopping.sql"), "--format", "json")
    assert explained.exit_code == 0, explained.output
    jobs = {j["sink"]: j for j in json.loads(explained.stdout)["jobs"]}
    assert jobs["shopping"]["topics"] == ["shopping_source"] and jobs["user_item_amount"]["sources"] == ["shopping"]
    assert all(j["maintenance"] for j in jobs.values())
    assert jobs["user_item_amount"]["columns"]["total_amount"] == ["shopping.amount"]  # column-level lineage

    granted = invoke("acls", "job", "User:etl", "--data-topic", "orders", "--format", "json")
    assert granted.exit_code == 0, granted.output
    body = json.loads(granted.stdout)
    assert (body["role"], body["principal"]) == ("job", "User:etl")
    assert any(a["name"] == "orders" and "read" in a["operations"] for a in body["acls"])

    port = free_port()
    stopped = invoke("dev", "status", "--format", "json",
                     env={"LOCKSTEP_HOME": str(tmp_path), "LOCKSTEP_BOOTSTRAP": f"127.0.0.1:{port}"})
    assert stopped.exit_code == ExitCode.UNREACHABLE  # a stopped broker is still exit 3
    assert json.loads(stopped.stdout)["broker"] == {"running": False, "pid": None, "bootstrap": f"127.0.0.1:{port}",
                                                    "topics": None}


@pytest.mark.parametrize(("sql", "says"), [
    ("ADD JAR /tmp/evil.jar", "ADD is not allowed"),
    ("INSERT OVERWRITE DIRECTORY '/tmp/out' SELECT 1", "INSERT is not allowed"),
    ("SELECT reflect('java.lang.Runtime', 'getRuntime')", "reflect() is not allowed"),
    ("SELECT * FROM parquet.`/etc`", "parquet.`/etc` is not allowed"),
    ("SELECT * FROM IDENTIFIER('csv.`/etc/passwd`')", "IDENTIFIER() is not allowed"),
    ("SELECT * FROM sales WHERE EXISTS (SELECT * FROM `/etc/passwd`)", "`/etc/passwd` is not allowed"),
    ("SELECT 1; DROP TABLE sales", "one statement at a time"),
])
def test_a_spark_query_that_is_not_a_read_is_refused_before_spark_starts(sql: str, says: str) -> None:
    result = invoke("query", "--engine", "spark", sql, env={"LOCKSTEP_COORDINATOR_URL": f"http://127.0.0.1:{free_port()}"})
    assert result.exit_code == 1 and says in result.stderr, result.stderr


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--statement-timeout", "5x", '"5x" (a number, optionally with a unit: us, ms, s, min, h, d)'),
    ("--max-result-size", "lots", '"lots" (a number, optionally with a unit: b, kb, mb, gb, tb)'),
    ("--idle-in-transaction-timeout", "-1s", '"-1s"'),
])
def test_a_bad_serve_limit_is_a_usage_error_that_says_which_forms_it_takes(flag: str, value: str, says: str) -> None:
    result = invoke("serve", flag, value)
    assert result.exit_code == 2 and f"Invalid value for '{flag}'" in result.stderr and says in result.stderr, \
        result.stderr
