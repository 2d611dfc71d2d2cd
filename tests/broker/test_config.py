"""BrokerConfig: defaults, the four layers, refusal of unknown keys and bad values, and the persisted broker id."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tidelog.broker.config import (
    BROKER_ID_FILE,
    BrokerConfig,
    config_keys,
    describe_keys,
    ensure_broker_id,
    load_config,
)
from tidelog.broker.config_values import (
    BadConfigValueError,
    BrokerIdMismatchError,
    ConfigError,
    UnknownConfigKeyError,
    parse_etcd_endpoint,
)
from tidelog.metadata.records import StreamConfig, StreamRecord
from tidelog.server import log_config_for
from tidelog.storage.config import FlushPolicy


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tidelog.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults() -> None:
    config = load_config(env={})
    assert config == BrokerConfig()
    assert config.id is None
    assert (config.host, config.port, config.wire_port) == ("127.0.0.1", 9292, 9293)
    assert config.data_dir == Path("./tidelog-data")
    assert config.nats_servers == () and config.embedded_nats
    assert config.etcd_endpoints == () and config.embedded_etcd
    assert config.default_flush_policy == "always"
    assert config.default_ack_timeout_ms == 5000
    assert config.max_message_bytes == 1024 * 1024
    assert config.max_message_bytes <= config.segment_max_bytes
    assert config.log_level == "info"
    assert config.advertised_host == "127.0.0.1"


def test_layers_override_key_by_key(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        """
        port = 1001
        wire_port = 1002
        log_level = "debug"
        nats_servers = ["nats://toml:4222"]
        compact_enabled = true
        """,
    )
    env = {"TIDELOG_WIRE_PORT": "2002", "TIDELOG_NATS_SERVERS": "nats://a:4222, nats://b:4222", "HOME": "/x"}
    config = load_config(path, env=env, flags={"nats_servers": ["nats://flag:4222"], "host": None})
    assert config.port == 1001  # TOML over the default
    assert config.wire_port == 2002  # environment over TOML
    assert config.log_level == "debug"  # TOML, untouched by later layers
    assert config.compact_enabled is True
    assert config.nats_servers == ("nats://flag:4222",)  # flags over everything
    assert config.host == "127.0.0.1"  # a None flag was not given
    assert not config.embedded_nats

    from_env = load_config(path, env=env)
    assert from_env.nats_servers == ("nats://a:4222", "nats://b:4222")  # comma-separated, trimmed


def test_environment_value_types() -> None:
    config = load_config(
        env={
            "TIDELOG_COMPACT_ENABLED": "yes",
            "TIDELOG_DEFAULT_UNCLEAN_LEADER_ELECTION": "0",
            "TIDELOG_DATA_DIR": "/var/lib/tidelog",
            "TIDELOG_ETCD_ENDPOINTS": "http://e1:2379,e2",
            "TIDELOG_ID": "",
            "TIDELOG_SEGMENT_MAX_BYTES": "1_000_000_000",
            "TIDELOG_DEFAULT_FLUSH_POLICY": "Never",
        }
    )
    assert config.compact_enabled is True
    assert config.default_unclean_leader_election is False
    assert config.data_dir == Path("/var/lib/tidelog")
    assert config.etcd_endpoints == ("http://e1:2379", "e2")
    assert config.id is None  # empty means unset
    assert config.segment_max_bytes == 1_000_000_000
    assert config.default_flush_policy == "never"


def test_process_environment_and_config_file_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from_variable = write_toml(tmp_path, "port = 3001\n")
    explicit = tmp_path / "explicit.toml"
    explicit.write_text("port = 3002\n")
    monkeypatch.setenv("TIDELOG_CONFIG", str(from_variable))
    monkeypatch.setenv("TIDELOG_WIRE_PORT", "3003")
    assert load_config().port == 3001  # TIDELOG_CONFIG names the file; it is not refused as a key
    assert load_config().wire_port == 3003  # os.environ is the default environment
    assert load_config(explicit).port == 3002  # --config wins over TIDELOG_CONFIG


def test_unknown_toml_key_is_refused_with_the_allowed_keys(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "prot = 1\n")
    with pytest.raises(UnknownConfigKeyError) as caught:
        load_config(path, env={})
    error = caught.value
    assert error.key == "prot" and str(path) in error.source
    message = str(error)
    assert "'prot'" in message and "did you mean 'port'" in message
    assert "allowed keys:" in message and all(key in message for key in config_keys())


def test_toml_tables_are_not_keys(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[broker]\nport = 1\n")
    with pytest.raises(UnknownConfigKeyError, match="'broker'"):
        load_config(path, env={})


def test_unknown_environment_variable_is_refused() -> None:
    with pytest.raises(UnknownConfigKeyError) as caught:
        load_config(env={"TIDELOG_PROT": "1"})
    message = str(caught.value)
    assert "TIDELOG_PROT" in message and "TIDELOG_PORT" in message and "TIDELOG_CONFIG" in message
    assert load_config(env={"OTHER_PORT": "1", "TIDELOGPORT": "1"}) == BrokerConfig()  # not our prefix


def test_the_open_append_bytes_cap_must_hold_the_largest_append() -> None:
    with pytest.raises(BadConfigValueError, match=r"max_open_append_bytes_per_connection.*largest append"):
        BrokerConfig(max_append_bytes=64 * 1024 * 1024, max_open_append_bytes_per_connection=32 * 1024 * 1024)
    BrokerConfig(max_append_bytes=1024, max_open_append_bytes_per_connection=1024)


def test_a_removed_key_is_refused_saying_it_was_removed(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("fsync_io_uring = false\n")
    with pytest.raises(UnknownConfigKeyError, match=r"fsync_io_uring.*removed: every fsync runs on worker threads"):
        load_config(path, env={})
    with pytest.raises(UnknownConfigKeyError, match=r"TIDELOG_FSYNC_IO_URING.*removed"):
        load_config(env={"TIDELOG_FSYNC_IO_URING": "false"})


def test_unknown_flag_is_refused() -> None:
    with pytest.raises(UnknownConfigKeyError, match="flag --no-such"):
        load_config(env={}, flags={"no_such": 1})


@pytest.mark.parametrize(
    ("env", "key", "expected"),
    [
        ({"TIDELOG_PORT": "abc"}, "port", "an integer from 0 to 65535"),
        ({"TIDELOG_PORT": "70000"}, "port", "an integer from 0 to 65535"),
        ({"TIDELOG_COMPACT_ENABLED": "maybe"}, "compact_enabled", "true or false"),
        ({"TIDELOG_DEFAULT_FLUSH_POLICY": "sometimes"}, "default_flush_policy", "'always', 'interval', 'never'"),
        ({"TIDELOG_LOG_LEVEL": "loud"}, "log_level", "one of 'debug'"),
        ({"TIDELOG_ETCD_ENDPOINTS": "ftp://x:1"}, "etcd_endpoints", "etcd endpoints"),
        ({"TIDELOG_NATS_SERVERS": "http://x:4222"}, "nats_servers", "NATS URLs"),
        ({"TIDELOG_ID": "has.dot"}, "id", "letters, digits"),
        ({"TIDELOG_MAX_MESSAGE_BYTES": "0"}, "max_message_bytes", "at least 1"),
        ({"TIDELOG_BROKER_LEASE_TTL_MS": "10"}, "broker_lease_ttl_ms", "at least 1000"),
    ],
)
def test_bad_environment_values_name_key_value_and_allowed(env: dict[str, str], key: str, expected: str) -> None:
    with pytest.raises(BadConfigValueError) as caught:
        load_config(env=env)
    error = caught.value
    ((variable, value),) = env.items()
    assert error.key == key and error.value == value
    message = str(error)
    assert repr(key) in message and variable in message and repr(value) in message and expected in message


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("port = true", "port"),  # a TOML bool is not an int, though Python's bool is
        ("port = 1.5", "port"),
        ("nats_servers = 'nats://a:1'", None),  # a single string is accepted as a comma list
        ("nats_servers = [1, 2]", "nats_servers"),
        ("compact_enabled = 1", "compact_enabled"),
        ("data_dir = ''", "data_dir"),
        ("host = 'a b'", "host"),
    ],
)
def test_bad_toml_values(tmp_path: Path, toml: str, key: str | None) -> None:
    path = write_toml(tmp_path, toml + "\n")
    if key is None:
        load_config(path, env={})
        return
    with pytest.raises(BadConfigValueError, match=f"bad value for '{key}' in config file") as caught:
        load_config(path, env={})
    assert caught.value.key == key


def test_cross_field_checks() -> None:
    with pytest.raises(BadConfigValueError, match=r"max_message_bytes.*at most segment_max_bytes"):
        load_config(env={"TIDELOG_MAX_MESSAGE_BYTES": "2000", "TIDELOG_SEGMENT_MAX_BYTES": "1000"})
    with pytest.raises(BadConfigValueError, match=r"wire_port.*a port other than port"):
        load_config(env={}, flags={"port": 5000, "wire_port": 5000})
    assert load_config(env={}, flags={"port": 0, "wire_port": 0}).port == 0  # both ephemeral is fine


def test_unreadable_or_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.toml", env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write_toml(tmp_path, "port = = 1\n"), env={})


def test_config_is_frozen_and_normalised() -> None:
    config = BrokerConfig(nats_servers=["nats://a:1"], data_dir="~/data", port="9000")  # type: ignore[arg-type]
    assert config.nats_servers == ("nats://a:1",)
    assert config.data_dir == Path("~/data").expanduser()
    assert config.port == 9000
    hash(config)  # hashable: nothing mutable inside
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.port = 1  # type: ignore[misc]
    with pytest.raises(BadConfigValueError, match="BrokerConfig arguments"):
        BrokerConfig(port=-1)
    assert BrokerConfig(host="0.0.0.0", advertise_host="broker-1.example").advertised_host == "broker-1.example"


def test_every_key_is_documented() -> None:
    described = describe_keys()
    assert list(described) == list(config_keys())
    assert all("Default:" in text and "Accepts" in text for text in described.values())
    assert "Default: 9292" in described["port"]


# ---- the persisted broker id ----


def test_broker_id_is_generated_once_and_kept(tmp_path: Path) -> None:
    config = BrokerConfig(data_dir=tmp_path / "data")
    first = ensure_broker_id(config)
    assert first.id is not None and len(first.id) >= 8
    assert (tmp_path / "data" / BROKER_ID_FILE).read_text().strip() == first.id
    assert ensure_broker_id(config).id == first.id  # a restart keeps it
    assert ensure_broker_id(first) == first
    other = ensure_broker_id(BrokerConfig(data_dir=tmp_path / "other"))
    assert other.id != first.id
    assert not list((tmp_path / "data").glob(".*.tmp"))  # the atomic write left no scratch file


def test_configured_broker_id_is_stored_and_enforced(tmp_path: Path) -> None:
    config = load_config(env={"TIDELOG_ID": "broker-1", "TIDELOG_DATA_DIR": str(tmp_path)})
    assert ensure_broker_id(config).id == "broker-1"
    assert ensure_broker_id(dataclasses.replace(config, id=None)).id == "broker-1"  # later starts without --id
    with pytest.raises(BrokerIdMismatchError, match=r"'broker-2'.*'broker-1'") as caught:
        ensure_broker_id(dataclasses.replace(config, id="broker-2"))
    assert caught.value.stored == "broker-1" and caught.value.path == tmp_path / BROKER_ID_FILE


def test_corrupt_broker_id_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / BROKER_ID_FILE).write_text("not/valid\n")
    with pytest.raises(ConfigError, match="valid broker id"):
        ensure_broker_id(BrokerConfig(data_dir=tmp_path))


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http://127.0.0.1:2379", ("127.0.0.1", 2379)),
        ("etcd-1:12379", ("etcd-1", 12379)),
        ("etcd-1", ("etcd-1", 2379)),
        ("http://[::1]:2379", ("::1", 2379)),
        ("https://etcd.example:4001", ("etcd.example", 4001)),  # TLS or not is the etcd_tls_* settings' business
    ],
)
def test_parse_etcd_endpoint(endpoint: str, expected: tuple[str, int]) -> None:
    assert parse_etcd_endpoint(endpoint) == expected


@pytest.mark.parametrize("endpoint", ["ftp://x:1", "http://x:99999", "http://x:1/path", ""])
def test_parse_etcd_endpoint_refuses(endpoint: str) -> None:
    with pytest.raises(ValueError):
        parse_etcd_endpoint(endpoint)


def test_stream_logs_take_the_preallocation_setting_within_their_segment_size() -> None:
    stream = StreamRecord("s", "s", "s", 1, 1, 0)
    assert log_config_for(BrokerConfig(), stream).preallocate_bytes == 4 * 1024 * 1024  # on by default
    assert log_config_for(BrokerConfig(segment_preallocate_bytes=0), stream).preallocate_bytes == 0
    small = StreamRecord("s", "s", "s", 1, 1, 0, StreamConfig(segment_max_bytes=1024 * 1024))
    assert log_config_for(BrokerConfig(), small).preallocate_bytes == 1024 * 1024
    assert log_config_for(BrokerConfig(), stream).flush_policy is FlushPolicy.ALWAYS


def test_an_https_etcd_endpoint_without_etcd_tls_is_refused(tmp_path: Path) -> None:
    # A TLS endpoint is never dialled in clear: without etcd_tls_ca the configuration is refused.
    with pytest.raises(BadConfigValueError, match=r"etcd_endpoints.*etcd_tls_ca"):
        BrokerConfig(data_dir=tmp_path, etcd_endpoints=("https://etcd.example:4001",))
    ok = BrokerConfig(data_dir=tmp_path, etcd_endpoints=("https://etcd.example:4001",), etcd_tls_ca=tmp_path / "ca")
    assert ok.etcd_tls


@pytest.mark.parametrize(
    ("settings", "key", "expected"),
    [
        ({"tls_cert": "c.pem"}, "tls_key", "set together with tls_cert"),
        ({"tls_key": "k.pem"}, "tls_cert", "set together with tls_key"),
        ({"tls_client_auth": "required"}, "tls_client_auth", "'none' unless tls_cert"),
        ({"tls_cert": "c", "tls_key": "k", "tls_client_auth": "optional"}, "tls_client_ca", "a CA file"),
        ({"nats_user": "u"}, "nats_password", "set together with nats_user"),
        ({"nats_servers": "nats://n:4222", "nats_user": "u", "nats_password": "p", "nats_token": "t"},
         "nats_token", "one NATS authentication at a time"),
        ({"nats_tls_ca": "ca.pem"}, "nats_tls_ca", "while nats_servers is empty"),
        ({"etcd_user": "u", "etcd_password": "p"}, "etcd_user", "while etcd_endpoints is empty"),
        ({"etcd_tls_cert": "c"}, "etcd_tls_key", "set together with etcd_tls_cert"),
    ],
)  # fmt: skip
def test_security_settings_that_only_work_together_are_refused(
    tmp_path: Path, settings: dict[str, str], key: str, expected: str
) -> None:
    env = {f"TIDELOG_{k.upper()}": v for k, v in settings.items()}
    with pytest.raises(BadConfigValueError) as refused:
        load_config(env={**env, "TIDELOG_DATA_DIR": str(tmp_path)})
    assert refused.value.key == key
    assert expected in str(refused.value)


def test_tls_settings_are_paths_and_turn_tls_on(tmp_path: Path) -> None:
    env = {"TIDELOG_TLS_CERT": "~/c.pem", "TIDELOG_TLS_KEY": "k.pem", "TIDELOG_TLS_CA": ""}
    config = load_config(env={**env, "TIDELOG_DATA_DIR": str(tmp_path)})
    assert config.tls and config.tls_cert == Path("~/c.pem").expanduser() and config.tls_ca is None
    assert not BrokerConfig(data_dir=tmp_path).tls


def test_the_cli_login_variables_are_not_broker_settings() -> None:
    """A shell that exported them for the CLI can still start a broker (unknown TIDELOG_* are refused)."""
    env = {"TIDELOG_CLIENT_USER": "app", "TIDELOG_CLIENT_PASSWORD": "pw", "TIDELOG_CLIENT_PASSWORD_FILE": "f"}
    assert load_config(env=env).data_dir is not None
