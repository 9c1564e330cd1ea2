"""Fixtures: a real Redis and real worker processes on free loopback ports, stopped by pid.

A test that leaves a child process behind fails the session.
"""

from __future__ import annotations

import os
import shutil

import psutil
import pytest

from gpulayer.lab.fleet import Fleet, wait_until
from tests.fleets import held_slots, running_fleet

# The session fleet: three CPU workers in two regions, one of them in another zone; w-a logs every job.
FLEET = {
    "w-a": dict(slots=2, zone="europe-west1-b", region="europe-west1", extra_args=["--log-jobs"]),
    "w-b": dict(slots=2, zone="europe-west1-c", region="europe-west1"),
    "w-c": dict(slots=1, zone="us-central1-a", region="us-central1"),
}
LEAK_GRACE = 15.0  # seconds a test's processes get to finish exiting after it


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _fleet_owned() -> set[int]:
    """Processes of fleets still running (a module's fleet outlives its first test) and their descendants."""
    owned = set()
    for fleet in list(Fleet.live):
        for pid in fleet.pids():
            owned.add(pid)
            try:
                owned.update(c.pid for c in psutil.Process(pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
    return owned


@pytest.fixture(scope="session", autouse=True)
def no_leaked_processes():
    """Fails the session if any process started by the tests outlives them."""
    yield
    me = psutil.Process()
    left = [p for p in me.children(recursive=True) if _alive(p)]
    for p in left:  # clean up what we started, then fail loudly
        p.kill()
    assert not left, f"tests leaked processes: {[(p.pid, ' '.join(p.cmdline()[:6])) for p in left]}"


@pytest.fixture(autouse=True)
def no_leaked_processes_per_test(request):
    """Fails the test that leaves a process behind (beyond the fleets still in use), and stops it."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield

    def leaked() -> list[psutil.Process]:
        owned = _fleet_owned()
        return [p for p in me.children(recursive=True) if p.pid not in before and p.pid not in owned and _alive(p)]

    try:
        wait_until(lambda: not leaked(), LEAK_GRACE, "the test's processes to exit")
    except TimeoutError:
        left = leaked()
        names = [(p.pid, " ".join(p.cmdline()[:6])) for p in left if _alive(p)]
        for p in left:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        if names:
            pytest.fail(f"{request.node.nodeid} left processes running: {names}")


_RANK_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture(autouse=True)
def no_leaked_rank_variables(request):
    """Fails the test that leaves torch.distributed's variables changed in this process: every later DDP run here
    (ours and Lightning's) would rendezvous where they point."""
    before = {name: os.environ.get(name) for name in _RANK_VARS}
    yield
    after = {name: os.environ.get(name) for name in _RANK_VARS}
    if after != before:
        for name, value in before.items():  # the next test starts as this one did
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        changed = {k: v for k, v in after.items() if v != before[k]}
        pytest.fail(f"{request.node.nodeid} left torch.distributed's variables changed: {changed}")


@pytest.fixture(scope="session")
def session_fleet(tmp_path_factory):
    with running_fleet(tmp_path_factory.mktemp("fleet"), FLEET, connect=True) as f:
        # Registered is not yet listening: the first test to use the fleet may be one that asks every worker
        # over the control channel (test_events, test_control), and with parallel test processes it may run
        # within a second of the start, before a worker consumes broadcasts.
        from gpulayer.app import app

        wait_until(lambda: len(app.control.ping(timeout=1.0, limit=len(FLEET))) == len(FLEET), 60,
                   "every worker of the session fleet to answer a ping")
        yield f


@pytest.fixture
def fleet(session_fleet, request):
    """The shared fleet, with this process connected to it.

    A test that leaves a gang's slots held after it would make every later gang on this fleet wait for room
    that never comes: it fails itself, naming what it held, so the failures after it point back to it.
    """
    session_fleet.connect()
    yield session_fleet
    try:
        wait_until(lambda: held_slots(session_fleet) == {}, 30, "the test's gangs to let go of their slots")
    except TimeoutError:
        pytest.fail(f"{request.node.nodeid} left gang slots held on the shared fleet: {held_slots(session_fleet)}")


@pytest.fixture
def fresh_fleet(tmp_path):
    """A fleet of its own for tests that kill or restart things; starts with Redis only."""
    with running_fleet(tmp_path / "fleet", slots_free=False) as f:
        yield f


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
