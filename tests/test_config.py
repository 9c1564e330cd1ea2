"""Settings precedence: keyword > environment > config file > state file > defaults."""

from __future__ import annotations

import json

import pytest

from gpulayer.config import load_settings
from gpulayer.errors import ConfigError


def write_state(home, url="redis://:p@127.0.0.1:7001/0", secret="state-secret"):
    home.mkdir(parents=True, exist_ok=True)
    (home / "cluster.json").write_text(json.dumps({"broker_url": url, "secret": secret}))


def test_defaults(gpulayer_home):
    s = load_settings()
    assert s.broker_url is None and s.heartbeat_interval == 1.0 and s.max_payload_bytes == 64 * 2**20


def test_state_file_is_the_fallback(gpulayer_home):
    write_state(gpulayer_home)
    s = load_settings()
    assert s.broker_url.endswith(":7001/0") and s.broker_from_state
    assert s.secret.get_secret_value() == "state-secret"


def test_config_file_beats_state_file(gpulayer_home):
    write_state(gpulayer_home)
    (gpulayer_home / "config.toml").write_text(
        '[gpulayer]\nbroker_url = "redis://cfg:6379/0"\nsecret = "cfg"\nheartbeat_interval = 0.5\n')
    s = load_settings()
    assert s.broker_url == "redis://cfg:6379/0" and not s.broker_from_state and s.heartbeat_interval == 0.5


def test_environment_beats_config_file(gpulayer_home, monkeypatch):
    (gpulayer_home).mkdir(parents=True)
    (gpulayer_home / "config.toml").write_text('[gpulayer]\nbroker_url = "redis://cfg:6379/0"\n')
    monkeypatch.setenv("GPULAYER_BROKER_URL", "redis://env:6379/0")
    monkeypatch.setenv("GPULAYER_WORKER_DEAD_AFTER", "9")
    s = load_settings()
    assert s.broker_url == "redis://env:6379/0" and s.worker_dead_after == 9.0


def test_keyword_beats_environment(gpulayer_home, monkeypatch):
    monkeypatch.setenv("GPULAYER_BROKER_URL", "redis://env:6379/0")
    assert load_settings(broker_url="redis://kw:6379/0").broker_url == "redis://kw:6379/0"


def test_environment_broker_does_not_borrow_the_state_secret(gpulayer_home, monkeypatch):
    write_state(gpulayer_home)
    monkeypatch.setenv("GPULAYER_BROKER_URL", "redis://env:6379/0")
    assert load_settings().secret is None


def test_bad_values_name_the_key(gpulayer_home, monkeypatch):
    monkeypatch.setenv("GPULAYER_HEARTBEAT_INTERVAL", "-1")
    with pytest.raises(ConfigError, match="heartbeat_interval"):
        load_settings()
    with pytest.raises(ConfigError, match="not a Redis URL"):
        load_settings(broker_url="amqp://x")


def test_unknown_config_key_is_an_error(gpulayer_home):
    gpulayer_home.mkdir(parents=True)
    (gpulayer_home / "config.toml").write_text('[gpulayer]\nbroker = "redis://x"\n')
    with pytest.raises(ConfigError, match="broker"):
        load_settings()


def test_settings_are_frozen(gpulayer_home):
    s = load_settings()
    with pytest.raises(Exception):
        s.broker_url = "redis://x"
