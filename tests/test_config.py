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


# -- durability: what an acknowledged write means (store/durability.py) -----------------------------------------
def test_durability_defaults_to_replicated_on_a_sentinel_group_and_local_on_one_redis(gpulayer_home):
    assert load_settings(broker_url="sentinel://h1:26379,h2:26379/gl").durability_mode() == "replicated"
    assert load_settings(broker_url="sentinels://h1:26379/gl").durability_mode() == "replicated"
    assert load_settings(broker_url="redis://h:6379/0").durability_mode() == "local"
    assert load_settings().durability_mode() == "local"
    # Either way on either broker, when asked; case and spaces aside; "" is unset (the example config's way).
    assert load_settings(broker_url="sentinel://h:1/gl", durability="local").durability_mode() == "local"
    assert load_settings(broker_url="redis://h:6379/0", durability=" Replicated").durability_mode() == "replicated"
    assert load_settings(broker_url="sentinel://h:1/gl", durability="").durability_mode() == "replicated"


def test_durability_from_the_environment_and_the_config_file(gpulayer_home, monkeypatch):
    gpulayer_home.mkdir(parents=True)
    (gpulayer_home / "config.toml").write_text('[gpulayer]\ndurability = "replicated"\ndurability_timeout = 0.25\n')
    s = load_settings(broker_url="redis://h:6379/0")
    assert s.durability_mode() == "replicated" and s.durability_timeout == 0.25
    monkeypatch.setenv("GPULAYER_DURABILITY", "local")
    assert load_settings(broker_url="sentinel://h:1/gl").durability_mode() == "local"


@pytest.mark.parametrize("value", ["sync", "replicas=1", "1"])
def test_an_unknown_durability_is_a_config_error_naming_the_choices(gpulayer_home, monkeypatch, value):
    monkeypatch.setenv("GPULAYER_DURABILITY", value)
    with pytest.raises(ConfigError) as err:
        load_settings(broker_url="sentinel://h:1/gl")
    assert f"durability={value!r}" in str(err.value) and "'replicated', 'strict' or 'local'" in str(err.value)


def test_strict_is_replicated_with_min_replicas_1_and_min_replicas_comes_from_the_environment(gpulayer_home,
                                                                                              monkeypatch):
    plain = load_settings(broker_url="sentinel://h:1/gl")
    assert plain.durability_mode() == "replicated" and plain.required_replicas() == 0  # degrades by default
    strict = load_settings(broker_url="sentinel://h:1/gl", durability="Strict")
    assert strict.durability_mode() == "replicated" and strict.required_replicas() == 1
    monkeypatch.setenv("GPULAYER_MIN_REPLICAS", "2")
    assert load_settings(broker_url="sentinel://h:1/gl").required_replicas() == 2
    assert load_settings(broker_url="sentinel://h:1/gl", durability="strict").required_replicas() == 2
    monkeypatch.setenv("GPULAYER_MIN_REPLICAS", "-1")
    with pytest.raises(ConfigError, match="min_replicas"):
        load_settings(broker_url="sentinel://h:1/gl")


def test_a_durability_timeout_must_be_positive(gpulayer_home):
    with pytest.raises(ConfigError, match="durability_timeout"):
        load_settings(durability_timeout=0)


def test_the_setting_reaches_the_transport_options_and_back():
    from gpulayer.store import durability

    assert durability.to_options(False, 2.0) == {} and not durability.from_options({})
    waits = durability.from_options(durability.to_options(True, 0.25))
    assert waits and waits.command() == ("WAIT", 1, 250) and waits.min_replicas == 0
    strict = durability.from_options(durability.to_options(True, 0.25, 2))
    assert strict.command() == ("WAIT", 2, 250) and strict.min_replicas == 2
    # The form of a gpulayer before min_replicas (replicas, timeout) refused every miss: it reads as strict.
    assert durability.from_options({durability.OPTION: [1, 250]}).min_replicas == 1


def test_a_client_write_no_replica_confirmed_raises_naming_its_jobs():
    from gpulayer.errors import NotReplicated
    from gpulayer.store import durability

    waits = durability.Durability(1, 500)
    durability.confirm(1, waits, "submit", ["a"])  # confirmed: nothing to say
    durability.confirm(0, durability.NONE, "submit", ["a"])  # local: nothing asked
    with pytest.raises(NotReplicated) as err:
        durability.confirm(0, waits, "submit_batch", ["a", "b"])
    assert err.value.job_ids == ("a", "b")
    said = str(err.value)
    assert "2 jobs (first a)" in said and "0.5 s" in said and "same job id is safe" in said


def test_a_worker_write_no_replica_confirmed_is_logged_and_pauses_its_waits(caplog, monkeypatch):
    from gpulayer.store import durability

    monkeypatch.setattr(durability, "_paused_until", {})
    waits = durability.Durability(1, 500)
    assert durability.worker_waits(waits) and not durability.worker_waits(durability.NONE)
    assert durability.worker_confirm(1, waits, "the result x")
    assert durability.worker_waits(waits)
    with caplog.at_level("WARNING", logger="gpulayer.store.durability"):
        assert not durability.worker_confirm(0, waits, "the result y")
    assert "the result y reached the primary but no replica confirmed it" in caplog.text
    assert not durability.worker_waits(waits)  # for PAUSE_AFTER_MISS seconds


@pytest.mark.parametrize("given, size", [("400MB", 400_000_000), ("64MiB", 64 * 2**20), ("2GiB", 2 * 2**30),
                                         ("1.5 GB", 1_500_000_000), ("512kib", 512 * 1024), ("4096", 4096)])
def test_sizes_take_their_unit_from_the_environment(gpulayer_home, monkeypatch, given, size):
    monkeypatch.setenv("GPULAYER_MAX_PAYLOAD_BYTES", given)
    assert load_settings().max_payload_bytes == size


def test_sizes_take_their_unit_from_the_config_file(gpulayer_home):
    gpulayer_home.mkdir(parents=True)
    (gpulayer_home / "config.toml").write_text('[gpulayer]\nmax_payload_bytes = "2GiB"\n')
    assert load_settings().max_payload_bytes == 2 * 2**30
    (gpulayer_home / "config.toml").write_text('[gpulayer]\nmax_payload_bytes = 1000\n')
    assert load_settings().max_payload_bytes == 1000


def test_the_object_store_settings_and_their_defaults(gpulayer_home, monkeypatch):
    s = load_settings()
    assert (s.object_store, s.inline_limit_bytes, s.object_store_max_bytes, s.object_cache_bytes) == \
        (None, 2**20, None, None)
    assert s.result_expires == 86400  # a day, as Celery keeps results
    monkeypatch.setenv("GPULAYER_INLINE_LIMIT_BYTES", "400MB")
    monkeypatch.setenv("GPULAYER_OBJECT_STORE_MAX_BYTES", "2GiB")
    monkeypatch.setenv("GPULAYER_OBJECT_CACHE_BYTES", "")
    monkeypatch.setenv("GPULAYER_OBJECT_STORE", " s3://bucket/prefix ")
    s = load_settings()
    assert (s.object_store, s.inline_limit_bytes, s.object_store_max_bytes, s.object_cache_bytes) == \
        ("s3://bucket/prefix", 400_000_000, 2 * 2**30, None)


def test_a_bad_size_is_one_line_naming_the_variable_and_the_units(gpulayer_home):
    import os
    import subprocess
    import sys

    for command in (["-m", "gpulayer", "up"], ["-m", "gpulayer", "status"]):
        out = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, GPULAYER_MAX_PAYLOAD_BYTES="400XB"))
        assert out.returncode == 2, out.stdout
        assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
        assert "GPULAYER_MAX_PAYLOAD_BYTES" in out.stderr and "'400XB'" in out.stderr and "64MiB" in out.stderr
    assert not (gpulayer_home / "cluster.json").exists()  # `up` started nothing
