"""The broker password and the cluster secret stay out of sight: no command line, no `up` output, 0600 files.

Any local user reads every process's command line (`ps`, ``/proc/<pid>/cmdline``), so what gpulayer
starts (Redis, workers and their pool processes, Flower, the supervisor, ranks) takes its secrets from
the environment or a 0600 file instead.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import psutil

import gpulayer
from gpulayer import distributed

from .test_local import run_cli, wait_gone


def cmdline(pid: int) -> str:
    """What `ps` shows of ``pid``: its raw ``/proc/<pid>/cmdline`` (NUL-separated), or '' if it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def tree(*pids: int) -> dict[int, str]:
    """``{pid: command line}`` of ``pids`` and every process below them."""
    out = {}
    for pid in pids:
        try:
            top = psutil.Process(pid)
            procs = [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            out[p.pid] = cmdline(p.pid)
    return out


def assert_hidden(cmdlines: dict[int, str], *secrets: str) -> None:
    assert all(secrets), "nothing to look for"
    for pid, line in cmdlines.items():
        for s in secrets:
            assert s not in line, f"pid {pid} shows a secret on its command line: {line.replace(chr(0), ' ')}"


def test_up_with_flower_shows_no_secret_on_any_command_line(gpulayer_home):
    env = dict(os.environ)
    out = run_cli("up", "--workers", "2", "--slots", "1", "--flower", env=env)
    state = {}
    try:
        assert out.returncode == 0, out.stderr
        state_file = gpulayer_home / "cluster.json"
        state = json.loads(state_file.read_text())
        password, secret = urlparse(state["broker_url"]).password, state["secret"]
        assert state["flower_url"], f"Flower did not start: {out.stdout}{out.stderr}"

        # What `up` prints: the URL, masked; the state file and Redis's config file: ours alone.
        assert password not in out.stdout and secret not in out.stdout
        assert f"redis://:***@127.0.0.1:{urlparse(state['broker_url']).port}/0" in out.stdout
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        assert stat.S_IMODE((gpulayer_home / "redis" / "redis.conf").stat().st_mode) == 0o600

        # Every process the cluster runs: supervisor, Redis, workers and their pool processes, Flower.
        lines = tree(state["supervisor_pid"], state["redis_pid"])
        assert {state["redis_pid"], state["flower_pid"], *state["worker_pids"].values()} <= set(lines)
        assert len(lines) >= 6, lines  # supervisor, redis, flower, 2 workers, their pool processes
        assert_hidden(lines, password, secret)
        # And no process at all on this machine (the password and secret are this cluster's own).
        assert_hidden({int(d.name): cmdline(int(d.name)) for d in Path("/proc").iterdir() if d.name.isdigit()},
                      password, secret)

        # Asked for, `up` shows the URL whole.
        shown = run_cli("up", "--show-secrets", env=env)
        assert "already running" in shown.stdout and state["broker_url"] in shown.stdout
    finally:
        down = run_cli("down", env=env)
    assert down.returncode == 0, down.stderr
    if state:
        wait_gone([state["supervisor_pid"], state["redis_pid"], state["flower_pid"], *state["worker_pids"].values()])


def _cmdlines_of_this_rank() -> dict:
    """Runs in each rank: its own command line and its parent's (the worker, or torchrun's agent)."""
    import os

    def read(pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")

    return {"self": read(os.getpid()), "parent": read(os.getppid())}


def test_fleet_workers_redis_and_ranks_show_no_secret(fleet):
    lines = tree(fleet.redis_proc.pid, *(p.pid for p in fleet.workers.values()))
    assert len(lines) >= 1 + 2 * len(fleet.workers), lines  # redis, each worker and its pool
    assert_hidden(lines, fleet.password, fleet.secret)

    for launcher in ("direct", "torchrun"):
        job = distributed(_cmdlines_of_this_rank, nodes=2, procs_per_node=1, launcher=launcher, timeout=120)
        ranks = job.get(timeout=240)
        assert len(ranks) == 2
        assert_hidden({i: r["self"] + "\0" + r["parent"] for i, r in enumerate(ranks)}, fleet.password,
                      fleet.secret)
        assert "gpulayer.gang.rank" in ranks[0]["self"]


def test_an_operator_can_still_pass_the_broker_on_the_command_line(fresh_fleet, tmp_path):
    """`gpulayer worker --broker URL` stays: gpulayer's own launches just do not use it."""
    env = {k: v for k, v in os.environ.items() if k not in ("GPULAYER_BROKER_URL", "GPULAYER_CONFIG")}
    env.update(GPULAYER_SECRET=fresh_fleet.secret, GPULAYER_HOME=str(tmp_path / "home"), GPULAYER_PRELOAD="")
    with open(tmp_path / "op.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gpulayer", "worker", "--broker", fresh_fleet.url,
                                 "--name", "op-1", "--slots", "1", "--cuda", "off", "--zone", "ops-zone-a"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    fresh_fleet.workers["op-1"] = proc  # the fixture stops it, by pid
    fresh_fleet.wait_workers(["op-1"])
    fresh_fleet.connect()
    assert gpulayer.submit.delay(abs, -4, resources=gpulayer.Resources(zone="ops-zone-a")).get(timeout=60) == 4
