"""Remote control (``celery inspect``, ``app.control``): a broadcast returns once every live worker answered."""

from __future__ import annotations

import subprocess
import sys

from kombu import pidbox

from gpulayer.app import app

from .test_monitor import client_env


def spy_limits(monkeypatch) -> list:
    """The ``limit`` of every broadcast kombu's mailbox sends from here."""
    limits = []
    original = pidbox.Mailbox._broadcast

    def _broadcast(self, command, arguments=None, destination=None, reply=False, timeout=1, limit=None,
                   *args, **kwargs):
        limits.append(limit)
        return original(self, command, arguments, destination, reply, timeout, limit, *args, **kwargs)

    monkeypatch.setattr(pidbox.Mailbox, "_broadcast", _broadcast)
    return limits


def test_inspect_expects_one_reply_per_live_worker(fleet, monkeypatch):
    limits = spy_limits(monkeypatch)
    workers = set(fleet.workers)
    replies = app.control.inspect(timeout=30).ping()  # a long timeout: the limit, not the timeout, ends it
    assert {host.split("@")[0] for host in replies} == workers
    assert all(r == {"ok": "pong"} for r in replies.values())
    assert limits == [len(workers)]

    one = next(h for h in replies if h.startswith("w-a@"))
    assert list(app.control.inspect([one], timeout=30).ping()) == [one]  # a destination: as many as it names
    assert app.control.ping(timeout=30) and limits[1:] == [1, len(workers)]


def test_an_explicit_limit_or_pattern_is_kept(fleet, monkeypatch):
    limits = spy_limits(monkeypatch)
    assert len(app.control.inspect(limit=1, timeout=30).ping()) == 1
    app.control.inspect(timeout=0.5, pattern="w-a@*").ping()  # the workers match it: Celery's own wait
    app.control.revoke("no-such-job")  # no reply wanted: nothing to count
    assert limits == [1, None, None]


def test_celery_inspect_ping_answers_from_every_worker(fleet):
    out = subprocess.run([sys.executable, "-m", "celery", "-A", "gpulayer.app", "inspect", "ping", "--timeout", "30"],
                         capture_output=True, text=True, env=client_env(fleet), timeout=120)
    assert out.returncode == 0, out.stderr
    for name in fleet.workers:
        assert f"{name}@" in out.stdout, out.stdout


def test_a_broadcast_sent_while_a_registered_worker_starts_waits_for_it(fresh_fleet):
    # add_worker returns once the worker is in the registry, before Celery's worker subscribed to broadcasts.
    fresh_fleet.connect()
    fresh_fleet.add_worker("starting-1", torch=False)
    assert [name.split("@")[0] for name in app.control.inspect().stats() or {}] == ["starting-1"]
    fresh_fleet.add_worker("starting-2", torch=False)
    assert sorted(next(iter(r)).split("@")[0] for r in app.control.ping()) == ["starting-1", "starting-2"]


def test_a_worker_that_never_answers_holds_a_broadcast_only_so_long(fresh_fleet, monkeypatch, caplog):
    import os
    import time

    from gpulayer.engine import broadcast
    from gpulayer.models import WorkerInfo
    from gpulayer.store.registry import Registry

    fresh_fleet.connect()
    fresh_fleet.add_worker("real", torch=False)
    real = next(iter(app.control.ping()[0]))  # (waits until it answers)
    client = fresh_fleet.client()
    registry = Registry(client)
    # A record that heartbeats but whose Celery worker never comes: marked starting, as a worker is at first.
    registry.mark_starting("stuck", os.getpid())
    registry.heartbeat(WorkerInfo(id="stuck", hostname="nowhere", address="127.0.0.1", started_at=time.time()))
    monkeypatch.setattr(broadcast, "STARTING_WAIT", 0.5)
    try:
        assert registry.starting() == {"stuck"}
        replies = app.control.ping(destination=[real])  # not meant for it: no wait
        assert [next(iter(r)).split("@")[0] for r in replies] == ["real"]
        with caplog.at_level("WARNING", logger="gpulayer.engine.broadcast"):
            replies = app.control.ping(timeout=0.5)
        assert [next(iter(r)).split("@")[0] for r in replies] == ["real"]
        assert "stuck still not answering control" in caplog.text
    finally:
        registry.remove("stuck")
        client.close()
    assert registry.starting() == set()
