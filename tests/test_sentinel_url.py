"""The Sentinel broker URL: parsed, checked with errors that name the fix, carried through the settings, masked."""

from __future__ import annotations

import pytest

from gpulayer.config import load_settings, tls_options, with_sentinel_password, with_tls
from gpulayer.errors import ConfigError
from gpulayer.masking import mask_text, mask_url, secrets_of
from gpulayer.sentinel_url import SentinelTarget, is_sentinel_url, parse_sentinel_url


def test_the_full_form_is_read_into_its_parts():
    t = parse_sentinel_url("sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26380,[::1]:26381/jobs/3")
    assert t == SentinelTarget(sentinels=(("10.0.0.1", 26379), ("10.0.0.2", 26380), ("::1", 26381)),
                               service="jobs", db=3, password="s3cret")
    assert not t.tls


def test_defaults_db_0_and_sentinels_port():
    t = parse_sentinel_url("sentinel://h1,h2:1234/mymaster")
    assert t.sentinels == (("h1", 26379), ("h2", 1234)) and t.db == 0 and t.password is None


def test_sentinels_scheme_is_tls_with_rediss_options(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    url = with_tls(f"sentinels://:pw@h:26379/g?ssl_ca_certs={ca}")
    t = parse_sentinel_url(url)
    assert t.tls and t.tls_options == {"ssl_ca_certs": str(ca), "ssl_cert_reqs": "required"}
    assert tls_options(url)["ssl_ca_certs"] == str(ca)


@pytest.mark.parametrize("url, says", [
    ("sentinel://h1:26379", "append the master name"),
    ("sentinel://h1:26379/", "append the master name"),
    ("sentinel:///mymaster", "names no sentinel"),
    ("sentinel://h1:port/mymaster", "no valid port"),
    ("sentinel://h1:70000/mymaster", "no valid port"),
    ("sentinel://h1:26379/mymaster/x", "not a number"),
    ("sentinel://h1:26379/mymaster/0/extra", "more than a group and a db"),
    ("sentinel://h1:26379;sentinel://h2:26379/mymaster", "separate the sentinels with commas"),
    ("sentinel://user@h1:26379/mymaster", "write a ':' before it"),
    ("sentinel://h1:26379/mymaster?ssl_cert_reqs=none", "use sentinels://"),
    ("sentinel://h1:26379/mymaster?master_name=x", "does not take (master_name)"),
])
def test_bad_urls_are_refused_naming_the_fix(url, says):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        with_tls(url)


def test_the_settings_take_it_from_the_environment_and_carry_the_sentinels_password(monkeypatch):
    monkeypatch.setenv("GPULAYER_BROKER_URL", "sentinel://:pw@127.0.0.1:26379,127.0.0.1:26380/g/1")
    monkeypatch.setenv("GPULAYER_SENTINEL_PASSWORD", "sentinels-own")
    s = load_settings()
    t = parse_sentinel_url(s.broker_url)
    assert (t.password, t.sentinel_password, t.db, t.service) == ("pw", "sentinels-own", 1, "g")
    assert "sentinels-own" not in repr(s) and ":pw@" not in repr(s)


def test_the_config_file_and_the_flag_take_it_too(tmp_path, monkeypatch):
    monkeypatch.delenv("GPULAYER_BROKER_URL", raising=False)
    config = tmp_path / "config.toml"
    config.write_text('[gpulayer]\nbroker_url = "sentinel://10.1.1.1:26379/fleet"\n')
    monkeypatch.setenv("GPULAYER_CONFIG", str(config))
    assert parse_sentinel_url(load_settings().broker_url).service == "fleet"
    assert parse_sentinel_url(load_settings(broker_url="sentinel://h:1/other").broker_url).service == "other"


def test_a_sentinel_password_without_a_sentinel_url_is_refused():
    with pytest.raises(ConfigError, match="not a Sentinel group's"):
        with_sentinel_password("redis://h:6379/0", "pw")
    with pytest.raises(ConfigError, match="differ"):
        with_sentinel_password("sentinel://h:1/g?sentinel_password=a", "b")


def test_masking_hides_both_passwords():
    url = "sentinel://:serverpw@h1:26379,h2:26379/g?sentinel_password=sentpw"
    assert mask_url(url) == "sentinel://:***@h1:26379,h2:26379/g?sentinel_password=***"
    assert set(secrets_of(url, None)) == {"serverpw", "sentpw"}
    assert "sentpw" not in mask_text(f"lost {url} (refused)")


def test_plain_redis_urls_are_untouched():
    assert not is_sentinel_url("redis://:pw@h:6379/0")
    assert with_tls("redis://:pw@h:6379/0") == "redis://:pw@h:6379/0"
    with pytest.raises(ConfigError, match="sentinel://"):
        with_tls("unix:///tmp/redis.sock")


def test_kombu_and_celery_get_a_url_they_read_with_the_group_in_the_transport_options():
    from gpulayer.engine.sentinel import SENTINEL_OPTION, engine_url

    url = "sentinel://:p%40ss@h1:26379,h2:26380/my-group/2"
    engine, options = engine_url(url)
    assert engine == "redis://:p%40ss@my-group/2" and options == {SENTINEL_OPTION: url}
    assert engine_url("redis://:pw@h:6379/0") == ("redis://:pw@h:6379/0", {})
    assert engine_url("sentinels://h:26379/g?ssl_cert_reqs=none")[0] == "rediss://g/0"


def test_a_worker_calls_a_group_loopback_only_when_every_sentinel_is():
    from gpulayer.worker.main import is_loopback

    assert is_loopback("sentinel://127.0.0.1:26379,localhost:26380/g")
    assert not is_loopback("sentinel://127.0.0.1:26379,10.0.0.2:26379/g")
    assert is_loopback("redis://127.0.0.1:6379/0") and not is_loopback("redis://10.0.0.2:6379/0")
