from pathlib import Path

import pytest

from coordinator.settings import Settings, SettingsError, kafka_passthrough


def test_defaults_follow_design() -> None:
    s = Settings.from_env({})
    assert s.bootstrap == "127.0.0.1:9092"
    assert s.home == Path(".lockstep")
    assert s.warehouse == Path(".lockstep/warehouse")
    assert s.jars == Path(".lockstep/jars")
    assert s.coordinator_url == "http://127.0.0.1:6066"


def test_home_moves_warehouse_and_jars_unless_they_are_set() -> None:
    s = Settings.from_env({"LOCKSTEP_HOME": "/x", "LOCKSTEP_WAREHOUSE": "/w"})
    assert s.warehouse == Path("/w")
    assert s.jars == Path("/x/jars")


def test_kafka_passthrough_maps_variable_names_to_client_keys() -> None:
    env = {"LOCKSTEP_KAFKA_SASL_MECHANISM": "PLAIN", "LOCKSTEP_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "OTHER": "1"}
    assert kafka_passthrough(env) == {"sasl.mechanism": "PLAIN", "security.protocol": "SASL_SSL"}
    config = Settings.from_env(env).kafka_config(**{"group.id": "g"})
    assert config == {
        "bootstrap.servers": "127.0.0.1:9092",
        "sasl.mechanism": "PLAIN",
        "security.protocol": "SASL_SSL",
        "group.id": "g",
    }


@pytest.mark.parametrize("bad", ["localhost", "127.0.0.1:", ":9092", "host:port"])
def test_bad_bootstrap_names_the_variable(bad: str) -> None:
    with pytest.raises(SettingsError, match="LOCKSTEP_BOOTSTRAP"):
        Settings.from_env({"LOCKSTEP_BOOTSTRAP": bad})
