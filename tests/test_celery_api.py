"""Celery's own result and control APIs, and the ``celery`` command line, against a gpulayer cluster."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from celery.result import AsyncResult, GroupResult

import gpulayer
from gpulayer import JobFailed, Resources, group, submit
from gpulayer.app import app as celery_app
from gpulayer.lab.fleet import wait_until

CELERY = [sys.executable, "-m", "celery", "-A", "gpulayer.app"]
WORKTREE = str(Path(__file__).resolve().parents[1])


def add(x, y):
    return x + y


def fail(x):
    raise KeyError(x)


def train(lr, epochs=1, gate=""):
    """Waits until the file ``gate`` exists, so the job is seen running."""
    while not os.path.exists(gate):
        time.sleep(0.02)
    return lr * epochs


def cli_env(fleet=None, home: Path | None = None) -> dict:
    """Only what an operator sets: the broker URL and the secret (and where to import this checkout from)."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": WORKTREE, "GPULAYER_PRELOAD": ""}
    if home is not None:
        env["GPULAYER_HOME"] = str(home)
    if fleet is not None:
        env["GPULAYER_BROKER_URL"] = fleet.url
        env["GPULAYER_SECRET"] = fleet.secret
    return env


def celery_cli(*args, env, timeout=90) -> subprocess.CompletedProcess:
    return subprocess.run([*CELERY, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def running_job(fleet, tmp_path):
    """A job on w-b that runs until its gate file appears: ``(handle, gate)``."""
    gate = tmp_path / "gate"
    h = submit.delay(train, 0.1, epochs=3, gate=str(gate), resources=Resources(worker_ids=["w-b"]))
    inspector = celery_app.control.inspect(timeout=1)
    wait_until(lambda: any(j["id"] == h.id for jobs in (inspector.active() or {}).values() for j in jobs),
               timeout=60, what="the job running")
    try:
        yield h, gate
    finally:
        gate.write_text("")
        h.get(timeout=60)


def test_plain_async_result_and_group_restore_after_init(fleet):
    h = submit.delay(add, 2, 3)
    assert AsyncResult(h.id).get(timeout=60) == 5
    got = queue.Queue()  # the default app, not only this thread's current one
    threading.Thread(target=lambda: got.put(AsyncResult(h.id).get(timeout=60))).start()
    assert got.get(timeout=60) == 5
    with pytest.raises(JobFailed, match="KeyError"):
        AsyncResult(submit.delay(fail, "k").id).get(timeout=60)

    g = group(submit.s(add, i, 1) for i in range(5)).apply_async()
    g.save()
    restored = GroupResult.restore(g.id)
    assert restored is not None and restored.get(timeout=60) == [1, 2, 3, 4, 5]


def test_inspect_from_python_shows_summaries(fleet, running_job):
    h, _ = running_job
    inspector = celery_app.control.inspect(timeout=2)
    active = inspector.active()
    mine = [j for jobs in active.values() for j in jobs if j["id"] == h.id]
    assert mine and mine[0]["args"].startswith("train(0.1, epochs=3, gate=")
    assert "w-b" in mine[0]["kwargs"]  # the resources, as Flower shows them
    text = repr(active) + repr(inspector.reserved()) + repr(inspector.stats())
    assert "PickledFunction" not in text and "\\x80" not in text
    assert fleet.password not in text
    assert set(inspector.ping()) >= {n for n in inspector.stats()}


def test_revoke_terminate_stops_a_running_job(fleet, tmp_path):
    gate = tmp_path / "never"
    h = submit.delay(train, 1.0, gate=str(gate), resources=Resources(worker_ids=["w-a"]))
    inspector = celery_app.control.inspect(timeout=1)
    wait_until(lambda: any(j["id"] == h.id for jobs in (inspector.active() or {}).values() for j in jobs),
               timeout=60, what="the job running")
    celery_app.control.revoke(h.id, terminate=True)
    with pytest.raises(JobFailed) as err:
        AsyncResult(h.id).get(timeout=60)
    assert err.value.type_name == "JobStopped"
    wait_until(lambda: not any(j["id"] == h.id for jobs in (inspector.active() or {}).values() for j in jobs),
               timeout=60, what="the job gone from active")
    assert submit.delay(add, 1, 1, resources=Resources(worker_ids=["w-a"])).get(timeout=60) == 2


def test_celery_inspect_command_with_only_the_environment(fleet, running_job, tmp_path):
    h, _ = running_job
    env = cli_env(fleet, home=tmp_path / "home")
    active = celery_cli("inspect", "active", env=env)
    assert active.returncode == 0, active.stderr
    assert h.id in active.stdout and "train(0.1, epochs=3, gate=" in active.stdout
    assert "PickledFunction" not in active.stdout and "\\x80" not in active.stdout

    stats = celery_cli("inspect", "stats", "--json", env=env)
    assert stats.returncode == 0, stats.stderr
    data = json.loads(stats.stdout.strip().splitlines()[0])
    assert {"w-a", "w-b", "w-c"} <= {name.split("@")[0] for name in data}
    assert fleet.password not in stats.stdout and fleet.secret not in stats.stdout

    for what in ("reserved", "ping"):
        r = celery_cli("inspect", what, env=env)
        assert r.returncode == 0 and "w-b@" in r.stdout, r.stderr


def test_celery_command_reads_the_state_file(fleet, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    state = home / "cluster.json"
    state.write_text(json.dumps({"broker_url": fleet.url, "secret": fleet.secret}))
    state.chmod(0o600)
    r = celery_cli("inspect", "ping", env=cli_env(home=home))
    assert r.returncode == 0 and "pong" in r.stdout, r.stderr


def test_celery_command_without_a_cluster_says_what_to_set(tmp_path):
    r = celery_cli("inspect", "ping", env=cli_env(home=tmp_path / "empty"), timeout=60)
    assert r.returncode != 0
    assert "GPULAYER_BROKER_URL" in r.stderr and "gpulayer up" in r.stderr


def test_celery_worker_command_is_refused(fleet, tmp_path):
    r = celery_cli("worker", env=cli_env(fleet, home=tmp_path / "home"), timeout=60)
    assert r.returncode != 0
    assert "gpulayer worker" in r.stderr


def test_celery_events_dump_shows_job_summaries(fleet, tmp_path):
    # Workers send events once a monitor asks: the documented command, before `celery events`.
    enabled = subprocess.run([*CELERY, "control", "enable_events", "--timeout", "30"], capture_output=True, text=True,
                             env=cli_env(fleet, home=tmp_path / "home"), timeout=120)
    assert enabled.returncode == 0 and enabled.stdout.count("task events") == len(fleet.workers), enabled
    proc = subprocess.Popen([*CELERY, "events", "--dump"], env=cli_env(fleet, home=tmp_path / "home"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        found = False
        while not found and time.monotonic() < deadline:  # the dump may start after the first jobs
            n = int(time.monotonic() * 1000) % 100_000
            submit.delay(add, n, 7).get(timeout=60)
            end = time.monotonic() + 1.0
            while not found and time.monotonic() < end:
                try:
                    seen.append(lines.get(timeout=0.2))
                except queue.Empty:
                    continue
                # the job goes by its function (Celery's shadow name); the task underneath is gpulayer.submit
                found = "task succeeded: add" in seen[-1] and f"args=add({n}, 7)" in seen[-1]
        assert found, "".join(seen[-20:])
        assert not any("PickledFunction" in s for s in seen)
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()


def test_celery_call_of_submit_says_in_one_line_what_to_run_and_runs_a_reference_with_it(fleet, tmp_path):
    """`celery call` sends JSON, which no worker runs: refused in one line naming the flag that works."""
    env = dict(os.environ, GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret)

    def celery_call(*args):
        return subprocess.run([sys.executable, "-m", "celery", "-A", "gpulayer.app", "call", "gpulayer.submit", *args],
                              env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)

    plain = celery_call("--args", '["operator:add", 2, 3]')
    assert plain.returncode != 0
    assert plain.stderr.strip().splitlines() == [
        "Error: gpulayer.submit runs only messages signed by gpulayer, and `celery call` sends json: add "
        "--serializer gpulayer, with a 'pkg.mod:fn' reference as the first of --args, e.g. celery -A gpulayer.app "
        "call gpulayer.submit --serializer gpulayer --args '[\"os:getcwd\"]'"], plain.stderr
    bad = celery_call("--serializer", "gpulayer", "--args", '["add", 2, 3]')
    assert bad.stderr.strip().splitlines() == [
        "Error: function reference 'add' is not of the form 'package.module:function'"], bad.stderr
    sent = celery_call("--serializer", "gpulayer", "--args", '["operator:add", 2, 3]')
    assert sent.returncode == 0, sent.stderr
    assert submit.AsyncResult(sent.stdout.strip()).get(timeout=60) == 5
