from pathlib import Path

import pytest

from coordinator.installed import Installed
from coordinator.settings import CrashAt, Settings, SettingsError, kafka_passthrough
from tests.support import ROOT

NOT_INSTALLED = Installed(record=Path("/nonexistent/lockstep-install.json"))


def test_defaults_follow_design() -> None:
    s = Settings.from_env({}, installed=NOT_INSTALLED)
    assert s.bootstrap == "127.0.0.1:9092"
    assert s.home == Path(".lockstep")
    assert s.warehouse == ".lockstep/warehouse"
    assert s.jars == Path(".lockstep/jars")
    assert s.coordinator_url == "http://127.0.0.1:6066"


def test_home_moves_warehouse_and_jars_unless_they_are_set() -> None:
    s = Settings.from_env({"LOCKSTEP_HOME": "/x", "LOCKSTEP_WAREHOUSE": "/w"}, installed=NOT_INSTALLED)
    assert s.warehouse == "/w"
    assert s.jars == Path("/x/jars")


def test_the_install_record_places_home_and_jars_from_any_folder_unless_the_variables_say(tmp_path: Path) -> None:
    record = tmp_path / "lockstep-install.json"
    record.write_text('{"home": "/opt/ls/.lockstep", "jars": "/opt/ls/.lockstep/jars"}')
    installed = Installed.read(record)
    s = Settings.from_env({}, installed=installed)
    assert (s.home, s.jars, s.warehouse) == (Path("/opt/ls/.lockstep"), Path("/opt/ls/.lockstep/jars"),
                                             "/opt/ls/.lockstep/warehouse")
    # a home of one's own keeps the installed jars; LOCKSTEP_JARS overrides them
    s = Settings.from_env({"LOCKSTEP_HOME": "/mine"}, installed=installed)
    assert (s.home, s.jars) == (Path("/mine"), Path("/opt/ls/.lockstep/jars"))
    assert Settings.from_env({"LOCKSTEP_JARS": "/j"}, installed=installed).jars == Path("/j")
    assert f"where scripts/setup put them (/opt/ls/.lockstep/jars, recorded in {record})" in installed.where_jars({})
    assert "there is no install record /nonexistent/lockstep-install.json" in NOT_INSTALLED.where_jars({})
    assert installed.where_jars({"LOCKSTEP_JARS": "/j"}).startswith("LOCKSTEP_JARS=/j names that folder; unset it")


def test_kafka_passthrough_maps_variable_names_to_client_keys() -> None:
    env = {"LOCKSTEP_KAFKA_SASL_MECHANISM": "PLAIN", "LOCKSTEP_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "OTHER": "1",
           "LOCKSTEP_KAFKA_SASL_USERNAME": "u", "LOCKSTEP_KAFKA_SASL_PASSWORD": "p"}
    assert kafka_passthrough(env) == {"sasl.mechanism": "PLAIN", "security.protocol": "SASL_SSL",
                                      "sasl.username": "u", "sasl.password": "p"}
    config = Settings.from_env(env).kafka_config({"group.id": "g"}, client="lockstep-state")
    assert config == {
        "bootstrap.servers": "127.0.0.1:9092",
        "client.id": "lockstep-state",
        "sasl.mechanism": "PLAIN",
        "security.protocol": "SASL_SSL",
        "sasl.username": "u",
        "sasl.password": "p",
        "group.id": "g",
    }
    assert Settings.from_env({"LOCKSTEP_KAFKA_CLIENT_ID": "etl-7"}).kafka_config()["client.id"] == "etl-7"  # a user's wins


def test_kafka_security_is_told_to_java_clients_in_their_own_words() -> None:
    assert Settings.from_env({}).kafka_security.java_properties() == {"security.protocol": "PLAINTEXT"}
    scram = Settings.from_env({"LOCKSTEP_KAFKA_SECURITY_PROTOCOL": "sasl_ssl", "LOCKSTEP_KAFKA_SASL_MECHANISMS": "SCRAM-SHA-512",
                               "LOCKSTEP_KAFKA_SASL_USERNAME": "etl", "LOCKSTEP_KAFKA_SASL_PASSWORD": 'a\\b"c',
                               "LOCKSTEP_KAFKA_SSL_CA_LOCATION": "/ca.pem"}).kafka_security
    assert (scram.sasl, scram.tls) == (True, True)
    assert scram.java_properties() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="etl" '
                            'password="a\\\\b\\"c";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/ca.pem",
    }


@pytest.mark.parametrize(("env", "hint"), [
    ({"LOCKSTEP_KAFKA_SECURITY_PROTOCOL": "TLS"}, "use one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
    ({"LOCKSTEP_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}, "set LOCKSTEP_KAFKA_SASL_USERNAME and LOCKSTEP_KAFKA_SASL_PASSWORD"),
    ({"LOCKSTEP_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "LOCKSTEP_KAFKA_SASL_MECHANISM": "GSSAPI",
      "LOCKSTEP_KAFKA_SASL_USERNAME": "u", "LOCKSTEP_KAFKA_SASL_PASSWORD": "p"}, "share PLAIN, SCRAM-SHA-256"),
])
def test_kafka_security_that_not_every_client_can_use_is_refused_with_the_fix(env: dict[str, str], hint: str) -> None:
    with pytest.raises(SettingsError, match="LOCKSTEP_KAFKA_") as info:
        Settings.from_env(env)
    assert hint in str(info.value)


@pytest.mark.parametrize("bad", ["localhost", "127.0.0.1:", ":9092", "host:port"])
def test_bad_bootstrap_names_the_variable(bad: str) -> None:
    with pytest.raises(SettingsError, match="LOCKSTEP_BOOTSTRAP"):
        Settings.from_env({"LOCKSTEP_BOOTSTRAP": bad})


def test_every_knob_is_typed_and_defaults_follow_the_docs() -> None:
    s = Settings.from_env({})
    assert (s.barriers.interval_ms, s.barriers.max_inflight, s.barriers.liveness_ms, s.barriers.catchup_stride) == \
        (1000, 3, 30000, 10)
    assert (s.spark_master, s.spark_log_level, s.crash_at, s.schemas) == ("local[2]", None, None, None)
    assert (s.compact_every, s.vacuum_every_s, s.retain_barriers, s.log_retention_hours) == (100, 600, 100, 24)
    assert s.fuse_jobs and not Settings.from_env({"LOCKSTEP_FUSE_JOBS": "0"}).fuse_jobs
    assert Settings.from_env({"LOCKSTEP_FUSE_JOBS": "on"}).fuse_jobs
    set_ = Settings.from_env({"LOCKSTEP_BARRIER_INTERVAL_MS": "200", "LOCKSTEP_BARRIER_CATCHUP_STRIDE": "5",
                              "LOCKSTEP_SPARK_LOG_LEVEL": "error", "LOCKSTEP_CRASH_AT": "before_completion:0.25",
                              "LOCKSTEP_SPARK_MASTER": "spark://127.0.0.1:7077", "LOCKSTEP_SCHEMAS": "/s"})
    assert (set_.barriers.interval_ms, set_.barriers.catchup_stride) == (200, 5)
    assert (set_.spark_log_level, set_.spark_master, set_.schemas) == ("ERROR", "spark://127.0.0.1:7077", Path("/s"))
    assert set_.crash_at == CrashAt("before_completion", 0.25)
    assert (s.schema_registry_url, s.connect_url, s.postgres_url) == (
        "", "http://127.0.0.1:8083", "postgresql://postgres@127.0.0.1:5432/lockstep")
    cdc = Settings.from_env({"LOCKSTEP_SCHEMA_REGISTRY_URL": "https://registry.example.com:8081/",
                             "LOCKSTEP_POSTGRES_URL": "postgres://app@db.example.com/shop"})
    assert (cdc.schema_registry_url, cdc.postgres_url) == ("https://registry.example.com:8081",
                                                           "postgres://app@db.example.com/shop")


@pytest.mark.parametrize(("name", "bad", "hint"), [
    ("LOCKSTEP_BARRIER_INTERVAL_MS", "1s", "whole number >= 1"),
    ("LOCKSTEP_BARRIER_MAX_INFLIGHT", "-1", "whole number >= 1"),
    ("LOCKSTEP_JOB_LIVENESS_MS", "", "whole number >= 1"),
    ("LOCKSTEP_REPLICATION_FACTOR", "three", "whole number >= 1"),
    ("LOCKSTEP_COMPACT_EVERY", "often", "whole number >= 0"),
    ("LOCKSTEP_VACUUM_EVERY_S", "-5", "whole number >= 0"),
    ("LOCKSTEP_FUSE_JOBS", "sometimes", "1 (on) or 0 (off)"),
    ("LOCKSTEP_CRASH_AT", "before_lunch", "before_commit, after_write_files, before_completion"),
    ("LOCKSTEP_CRASH_AT", "before_commit:2", "between 0 and 1"),
    ("LOCKSTEP_SPARK_LOG_LEVEL", "loud", "WARN"),
    ("LOCKSTEP_COORDINATOR_URL", "127.0.0.1:6066", "http://127.0.0.1:6066"),
    ("LOCKSTEP_COORDINATOR_URL", "http://127.0.0.1:port", "http://127.0.0.1:6066"),
    ("LOCKSTEP_WAREHOUSE", "s3://lake/wh", "s3a://lake/wh"),
    ("LOCKSTEP_WAREHOUSE", "s3a://", "s3a://bucket/prefix"),
    ("LOCKSTEP_S3_ENDPOINT", "127.0.0.1:9000", "http://127.0.0.1:9000"),
    ("LOCKSTEP_COORDINATOR_URL", "http://127.0.0.1:6066,127.0.0.1:6067", "comma-separated"),
    ("LOCKSTEP_METASTORE", "derby://127.0.0.1:1527/metastore", "jdbc:derby://127.0.0.1:1527/metastore"),
    ("LOCKSTEP_DRIVER_JVM_OPTIONS", "-Xmx3g TieredStopAtLevel=1", "'-XX:TieredStopAtLevel=1'"),
    ("LOCKSTEP_SCHEMA_REGISTRY_URL", "127.0.0.1:8081", "http://127.0.0.1:8081/apis/ccompat/v7"),
    ("LOCKSTEP_CONNECT_URL", "http://127.0.0.1:rest", "http://127.0.0.1:8083"),
    ("LOCKSTEP_POSTGRES_URL", "127.0.0.1:5432", "postgresql://postgres@127.0.0.1:5432/lockstep"),
    ("LOCKSTEP_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432", "postgresql://user@host:port/database"),
])
def test_a_bad_value_names_the_variable_and_the_fix(name: str, bad: str, hint: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({name: bad})
    assert str(info.value).startswith(f"{name}={bad!r}") and hint in str(info.value)


def test_a_metastore_makes_the_session_catalog_hive_and_none_leaves_it_alone() -> None:
    assert Settings.from_env({}).catalog_conf() == {}
    derby = Settings.from_env({"LOCKSTEP_METASTORE": "jdbc:derby://127.0.0.1:1527/metastore"}).catalog_conf()
    assert derby["spark.sql.catalogImplementation"] == "hive"
    assert derby["spark.hadoop.javax.jdo.option.ConnectionURL"] == "jdbc:derby://127.0.0.1:1527/metastore;create=true"
    service = Settings.from_env({"LOCKSTEP_METASTORE": "thrift://meta.example.com:9083"}).catalog_conf()
    assert service == {"spark.sql.catalogImplementation": "hive",
                       "spark.hadoop.hive.metastore.uris": "thrift://meta.example.com:9083"}


def test_several_coordinators_are_asked_in_turn_and_a_worker_serves_on_the_first() -> None:
    both = Settings.from_env({"LOCKSTEP_COORDINATOR_URL": "http://127.0.0.1:6070, http://127.0.0.1:6071"})
    assert both.coordinator_urls == ("http://127.0.0.1:6070", "http://127.0.0.1:6071")
    assert (both.coordinator_host, both.coordinator_port) == ("127.0.0.1", 6070)


def test_a_warehouse_is_a_folder_or_a_uri_and_tables_live_under_it(tmp_path: Path) -> None:
    local = Settings.from_env({"LOCKSTEP_WAREHOUSE": str(tmp_path / "wh")})
    assert local.warehouse_is_local and local.table_location("t") == str(tmp_path / "wh" / "t")
    assert Settings.from_env({"LOCKSTEP_WAREHOUSE": f"file:{tmp_path}/wh"}).table_location("t") == str(tmp_path / "wh" / "t")
    remote = Settings.from_env({"LOCKSTEP_WAREHOUSE": "s3a://lake/wh/", "LOCKSTEP_S3_ENDPOINT": "http://127.0.0.1:9000",
                                "LOCKSTEP_S3_ACCESS_KEY": "k", "LOCKSTEP_S3_SECRET_KEY": "s"})
    assert not remote.warehouse_is_local and remote.table_location("t") == "s3a://lake/wh/t"
    conf = remote.s3.hadoop_conf()
    assert conf["fs.s3a.endpoint"] == "http://127.0.0.1:9000" and conf["fs.s3a.connection.ssl.enabled"] == "false"
    assert (conf["fs.s3a.access.key"], conf["fs.s3a.secret.key"]) == ("k", "s")
    assert Settings.from_env({}).s3.hadoop_conf() == {}  # AWS itself, Hadoop's own credential chain
    with pytest.raises(SettingsError, match="both LOCKSTEP_S3_ACCESS_KEY and LOCKSTEP_S3_SECRET_KEY"):
        Settings.from_env({"LOCKSTEP_S3_ACCESS_KEY": "k"})


def test_nothing_else_reads_lockstep_variables() -> None:
    """One Settings: LOCKSTEP_* is read in coordinator/settings.py only (children get it passed)."""
    readers = [str(p.relative_to(ROOT)) for package in ("coordinator", "spark_jobs", "lockstep")
               for p in ROOT.glob(f"{package}/**/*.py")
               if p.name != "settings.py" and any(f"{call}(\"LOCKSTEP_" in p.read_text()
                                                  for call in ("environ.get", "getenv", "env.get", "environ["))]
    assert readers == []


def test_no_password_or_key_shows_in_a_repr() -> None:
    settings = Settings.from_env({
        "LOCKSTEP_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "LOCKSTEP_KAFKA_SASL_MECHANISM": "PLAIN",
        "LOCKSTEP_KAFKA_SASL_USERNAME": "u", "LOCKSTEP_KAFKA_SASL_PASSWORD": "kafka-pw-1",
        "LOCKSTEP_S3_ENDPOINT": "http://127.0.0.1:9000", "LOCKSTEP_S3_ACCESS_KEY": "a", "LOCKSTEP_S3_SECRET_KEY": "s3-key-1",
        "LOCKSTEP_SERVE_PASSWORD": "serve-pw-1"})
    shown = repr(settings) + repr(settings.kafka_security) + str(settings)
    assert settings.kafka_security.password == "kafka-pw-1"  # kept, only not shown
    assert not any(secret in shown for secret in ("kafka-pw-1", "s3-key-1", "serve-pw-1")), shown
