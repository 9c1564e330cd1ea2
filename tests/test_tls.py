"""A rediss:// broker: gpulayer's own transport (the take a SIGKILL cannot lose) over TLS, for every client.

The fleets here run a redis-server that speaks TLS only (no plain port) and asks every client for a
certificate, so any connection that skipped the URL's TLS options (a worker's janitor, its gang agent,
a rank, the result backend, a pub/sub channel, the client) would fail the test.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

import gpulayer
from gpulayer import distributed, submit
from gpulayer.app import app
from gpulayer.config import load_settings, tls_options, with_tls
from gpulayer.engine import transport
from gpulayer.errors import ConfigError, JobFailed
from gpulayer.engine import redis_tls
from gpulayer.engine.redis_tls import TLSConnection
from gpulayer.store.connection import connect_redis
from gpulayer.lab.fleet import Fleet, TlsFiles

from .test_chaos import kill_each_worker_mid_run


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_tls_files(where: Path) -> TlsFiles:
    """A throwaway CA, and a server and a client certificate it signed (openssl's command line)."""
    where.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]  # cheaper handshakes than RSA
    _openssl("req", "-x509", *ec, "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=gpulayer test CA", cwd=where)
    (where / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ext in (("server", ["-extfile", "server.ext"]), ("client", [])):
        _openssl("req", *ec, "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN=gpulayer test {name}", cwd=where)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "1", *ext, cwd=where)
    return TlsFiles(ca=where / "ca.pem", server_cert=where / "server.pem", server_key=where / "server.key",
                    client_cert=where / "client.pem", client_key=where / "client.key")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    if shutil.which("openssl") is None:
        if os.environ.get("CI"):
            pytest.fail("no openssl command line to make a throwaway CA (required under CI)")
        pytest.skip("no openssl command line to make a throwaway CA")
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def tls_fleet(tmp_path, tls_files):
    f = Fleet(tmp_path / "fleet")
    f.start_redis(tls=tls_files)
    try:
        yield f
    finally:
        f.stop()


# -- the URL and the transport: no Redis needed ---------------------------------------------------

def test_rediss_selects_gpulayers_transport_with_the_urls_tls_options(tls_files, gpulayer_home):
    url = with_tls("rediss://:pw@127.0.0.1:6380/0", **tls_files.client_options())
    assert transport.transport_for(url) == transport.NAME == transport.transport_for("redis://127.0.0.1:6379/0")
    opts = tls_options(url)
    assert opts == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(tls_files.ca),
                    "ssl_certfile": str(tls_files.client_cert), "ssl_keyfile": str(tls_files.client_key)}
    # What configure() makes of it, in a process of its own (configure points this process's app elsewhere).
    probe = (
        "import sys, gpulayer.app as a, gpulayer.engine.transport as b\n"
        "from gpulayer.config import load_settings\n"
        "a.configure(load_settings(broker_url=sys.argv[1], secret='s'))\n"
        "c = a.app.connection_for_write()\n"
        "print(a.app.conf.broker_transport, type(c.transport) is b.Transport, c.ssl == a.app.conf.broker_use_ssl,\n"
        "      a.app.conf.redis_backend_use_ssl == c.ssl, a.app.backend.connparams['connection_class'].__name__)\n")
    out = subprocess.run([sys.executable, "-c", probe, url], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["gpulayer", "True", "True", "True", "TLSConnection"], out.stderr[-2000:]


def test_rediss_checks_the_certificate_unless_told_otherwise(tls_files, gpulayer_home, monkeypatch):
    s = load_settings(broker_url="rediss://:pw@redis.internal:6380/0")
    assert s.broker_url == "rediss://:pw@redis.internal:6380/0?ssl_cert_reqs=required"
    assert with_tls("rediss://h:6380/0?ssl_cert_reqs=CERT_NONE") == "rediss://h:6380/0?ssl_cert_reqs=none"
    monkeypatch.setenv("GPULAYER_SSL_CA_CERTS", str(tls_files.ca))  # settings and URL query say the same
    s = load_settings(broker_url="rediss://h:6380/0")
    assert tls_options(s.broker_url)["ssl_ca_certs"] == str(tls_files.ca)
    assert load_settings(broker_url=s.broker_url).broker_url == s.broker_url  # folding twice changes nothing


@pytest.mark.parametrize("url, env, message", [
    ("unix:///run/redis.sock", {}, "not a Redis URL gpulayer can use"),
    ("redis+socket:///run/redis.sock", {}, "not a Redis URL gpulayer can use"),
    ("sentinel://:pw@h:26379", {}, "names no group: append the master name"),  # tests/test_sentinel_url.py: the rest
    ("redis://h:6379/0?ssl_cert_reqs=required", {}, "the broker URL is redis:// \\(no TLS\\)"),
    ("redis://h:6379/0", {"GPULAYER_SSL_CA_CERTS": "/etc/hostname"}, "use rediss://"),
    ("rediss://:pw@h:6380/0?ssl_cert_reqs=maybe", {}, "not one of required, optional, none"),
    ("rediss://h:6380/0?ssl_ca_certs=/no/such/ca.pem", {}, "is not a file"),
    ("rediss://h:6380/0?ssl_cert_reqs=none", {"GPULAYER_SSL_CERT_REQS": "required"}, "set it in one place"),
])
def test_what_gpulayer_cannot_make_safe_is_refused_with_the_way_out(url, env, message, gpulayer_home,
                                                                   monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match=message) as e:
        load_settings(broker_url=url)
    assert "pw" not in str(e.value), "the message never shows the broker's password"
    with pytest.raises(ConfigError, match="no transport with SIGKILL-safe takes"):
        transport.transport_for("unix:///run/redis.sock")


# -- a real Redis that speaks TLS only -------------------------------------------------------------

def echo_over_tls(x):
    return x, gpulayer.current_worker().id, gpulayer.app.redis_client().ping()


def started_then_sleeps(key):
    import time as _t

    gpulayer.app.redis_client().set(key, 1)
    _t.sleep(120)


def gang_rank():
    import os as _os

    return int(_os.environ["RANK"]), _os.environ["GPULAYER_WORKER_ID"]


def test_a_tls_fleet_serves_jobs_groups_gangs_and_cancels(tls_fleet, tls_files):
    fleet = tls_fleet
    assert fleet.url.startswith("rediss://")
    # Redis has no plain port, and refuses a TLS client without a certificate.
    with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
        connect_redis(with_tls(fleet.url.split("?")[0], ssl_ca_certs=str(tls_files.ca)),
                      socket_connect_timeout=2).ping()
    with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
        connect_redis(fleet.url.replace("rediss://", "redis://").split("?")[0], socket_connect_timeout=2).ping()
    fleet.add_workers({"s1": dict(slots=2, zone="z1", torch=False), "s2": dict(slots=2, zone="z2", torch=False)})
    fleet.connect()
    assert app.conf.broker_transport == transport.NAME and app.conf.broker_use_ssl["ssl_ca_certs"] == str(tls_files.ca)
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, transport.Transport)
        conn.ensure_connection(max_retries=1)
        assert issubclass(conn.default_channel.client.connection_pool.connection_class, TLSConnection)
    assert app.backend.client.connection_pool.connection_class is TLSConnection

    assert submit.delay(echo_over_tls, 1, resources=gpulayer.Resources(zone="z2")).get(timeout=60) == (1, "s2", True)
    g = gpulayer.group(submit.s(echo_over_tls, i) for i in range(6)).apply_async()
    assert [r[0] for r in g.get(timeout=60)] == list(range(6))
    assert [r[0] for r in gpulayer.submit_batch([submit.s(echo_over_tls, i) for i in range(20)]).get(timeout=60)] \
        == list(range(20))

    # Cancel goes over the reaper's pub/sub channel; the gang over the agent's orders and the ranks' channel.
    key = f"tls:started:{time.time()}"
    h = submit.delay(started_then_sleeps, key)
    client = fleet.client()
    deadline = time.monotonic() + 60
    while client.get(key) is None:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    h.cancel()
    with pytest.raises(JobFailed, match="cancelled"):
        h.get(timeout=60)
    # An operator's way: the plain rediss:// URL, the TLS options as GPULAYER_SSL_* settings.
    env = dict(os.environ, GPULAYER_BROKER_URL=fleet.url.split("?")[0], GPULAYER_SECRET=fleet.secret,
               **{f"GPULAYER_{k.upper()}": v for k, v in tls_files.client_options().items()})
    out = subprocess.run([sys.executable, "-m", "gpulayer", "status", "--json"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert {w["id"] for w in json.loads(out.stdout)["workers"]} == {"s1", "s2"}
    job = distributed(gang_rank, nodes=2, procs_per_node=1)
    assert sorted(r[0] for r in job.get(timeout=120)) == [0, 1]
    assert {w for _, w in job.get(timeout=5)} == {"s1", "s2"}
    client.close()


def test_tls_connections_share_one_context_until_a_certificate_changes(tls_fleet, tls_files):
    """redis-py builds an SSLContext, loading the system's CA bundle, per connection; TLSConnection, per process."""
    assert list(inspect.signature(redis.SSLConnection._wrap_socket_with_ssl).parameters) == ["self", "sock"], \
        "redis-py changed the method TLSConnection overrides (written for redis-py 8.1)"
    redis_tls._contexts.clear()
    clients = [connect_redis(tls_fleet.url) for _ in range(3)]
    assert all(c.ping() for c in clients) and len(redis_tls._contexts) == 1
    assert all(c.connection_pool.connection_class is TLSConnection for c in clients)  # installed by engine/
    st = tls_files.client_cert.stat()
    os.utime(tls_files.client_cert, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a rotated certificate
    assert connect_redis(tls_fleet.url).ping() and len(redis_tls._contexts) == 2
    for c in clients:
        c.close()


@pytest.mark.timeout(600)
def test_sigkilled_workers_lose_no_job_and_run_none_twice_over_tls(tls_fleet):
    """tests/test_chaos.py's case, with every worker, janitor and client on rediss://. Each kill waits for
    the last victim to be back (on a busy machine a restart can outlast the next kill, leaving no worker to
    hand back the cut jobs), so more jobs keep the run going past the third kill."""
    kill_each_worker_mid_run(tls_fleet, n=900, wait_restarted=True)
