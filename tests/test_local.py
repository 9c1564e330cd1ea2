"""The embedded cluster: `gpulayer up` / `down` and `gpulayer.init()` with nothing configured."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time

import psutil
import redis

from gpulayer.store.registry import Registry


def run_cli(*args, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "gpulayer", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def wait_gone(pids, timeout=30):
    deadline = time.monotonic() + timeout
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if psutil.pid_exists(p)]}"
        time.sleep(0.1)


def test_up_status_down(gpulayer_home):
    env = dict(os.environ)
    out = run_cli("up", "--workers", "2", "--slots", "1", env=env)
    try:
        assert out.returncode == 0, out.stderr
        state_file = gpulayer_home / "cluster.json"
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        state = json.loads(state_file.read_text())
        assert state["broker_url"].split("@")[1] in out.stdout  # masked: see test_secrets.py
        assert state["broker_url"].startswith("redis://:") and "@127.0.0.1:" in state["broker_url"]
        assert (gpulayer_home / "redis" / "appendonlydir").exists() or \
            any(p.name.startswith("appendonly") for p in (gpulayer_home / "redis").iterdir())

        client = redis.Redis.from_url(state["broker_url"])
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert {w.id for w in Registry(client).snapshot()} == {"local-1", "local-2"}
        client.close()
        # Without a password Redis refuses us.
        anon = redis.Redis(host="127.0.0.1", port=int(state["broker_url"].rsplit(":", 1)[1].split("/")[0]))
        try:
            anon.get("x")
            raise AssertionError("the embedded Redis accepted a client without its password")
        except redis.AuthenticationError:
            pass
        except redis.ResponseError as err:
            assert "NOAUTH" in str(err)
        anon.close()

        again = run_cli("up", env=env)
        assert "already running" in again.stdout

        st = run_cli("status", "--json", env=env)
        assert st.returncode == 0, st.stderr
        report = json.loads(st.stdout)
        assert sorted(w["id"] for w in report["workers"]) == ["local-1", "local-2"]
        assert state["secret"] not in st.stdout and "***" in report["broker"]

        pids = [state["supervisor_pid"], state["redis_pid"], *state["worker_pids"].values()]
    finally:
        down = run_cli("down", env=env)
    assert down.returncode == 0 and "stopped" in down.stdout
    wait_gone(pids)
    assert not (gpulayer_home / "cluster.json").exists()


def test_init_starts_a_cluster_that_lives_as_long_as_the_process(gpulayer_home, tmp_path):
    script = tmp_path / "use_init.py"
    script.write_text(textwrap.dedent("""
        import json, os, psutil
        import gpulayer
        from gpulayer import submit

        gpulayer.init(workers=2, slots=1)
        print(json.dumps({"sum": submit.delay(lambda a, b: a + b, 2, 3).get(timeout=60),
                          "tree": [p.pid for p in psutil.Process().children(recursive=True)]}))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["sum"] == 5
    assert len(result["tree"]) >= 4  # supervisor, redis, two workers (and their pool processes)
    wait_gone(result["tree"])
    assert not (gpulayer_home / "cluster.json").exists(), "a process-scoped cluster must not pose as `gpulayer up`"


def test_init_without_any_cluster_outlives_a_killed_parent_by_at_most_a_moment(gpulayer_home, tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent("""
        import json, os, psutil, sys
        import gpulayer
        gpulayer.init(workers=1, slots=1)
        print(json.dumps([p.pid for p in psutil.Process().children(recursive=True)]), flush=True)
        sys.stdin.read()
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    try:
        tree = json.loads(proc.stdout.readline())
        proc.kill()  # no atexit: the supervisor must notice by itself
        proc.wait()
        wait_gone(tree)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
