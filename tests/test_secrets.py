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
import pytest

import gpulayer
from gpulayer import distributed
from gpulayer.deadline import wait_until

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

        # Every process the cluster runs: supervisor, Redis, workers and their pool processes, Flower. (`up`
        # returns once the workers registered; they fork their pools a moment later, once torch is imported.)
        def whole_tree():  # supervisor, redis, flower, 2 workers, their pool processes
            lines = tree(state["supervisor_pid"], state["redis_pid"])
            return lines if len(lines) >= 6 else None

        lines = wait_until(whole_tree, 120, "the workers' pool processes")
        assert {state["redis_pid"], state["flower_pid"], *state["worker_pids"].values()} <= set(lines)
        assert_hidden(lines, password, secret)
        # And no process at all on this machine (the password and secret are this cluster's own).
        assert_hidden({int(d.name): cmdline(int(d.name)) for d in Path("/proc").iterdir() if d.name.isdigit()},
                      password, secret)

        # Asked for, `up` shows the URL whole.
        shown = run_cli("up", "--show-secrets", env=env)
        assert "already running" in shown.stdout and state["broker_url"] in shown.stdout

        # What a script prints of what init() gives back, with a job whose error quotes the URL; `gpulayer status`.
        script = run_python(SCRIPT_PRINTS_WHAT_INIT_GIVES, env=env)
        assert script.returncode == 0 and "redis://:***@127.0.0.1" in script.stdout, script.stderr
        assert "cannot reach redis://:***@" in script.stdout and "result 3" in script.stdout, script.stdout
        status = run_cli("status", env=env)
        assert status.returncode == 0 and "local-1" in status.stdout, status.stderr
        for name, text in (("the script", script.stdout + script.stderr), ("status", status.stdout + status.stderr)):
            assert password not in text and secret not in text, f"{name} shows a secret:\n{text}"
    finally:
        down = run_cli("down", env=env)
    assert down.returncode == 0, down.stderr
    if state:
        wait_gone([state["supervisor_pid"], state["redis_pid"], state["flower_pid"], *state["worker_pids"].values()])
        # Every log the cluster wrote: the supervisor's, each worker's (the job's error among them), Flower's, Redis's.
        logs = {p.relative_to(gpulayer_home): p.read_text(errors="replace") for p in gpulayer_home.rglob("*.log")}
        assert len(logs) >= 4 and "cannot reach redis://:***@" in "".join(logs.values()), sorted(logs)
        assert not [name for name, text in logs.items() if password in text or secret in text]


SCRIPT_PRINTS_WHAT_INIT_GIVES = """
import os, gpulayer
settings = gpulayer.init()   # the running `gpulayer up` cluster
print(repr(settings)); print(settings)
def quote_the_url():
    raise RuntimeError("cannot reach " + os.environ["GPULAYER_BROKER_URL"])
try:
    gpulayer.submit.delay(quote_the_url).get(timeout=60)
except gpulayer.JobFailed as err:
    print(repr(err)); print(err); print(err.traceback)
print("result", gpulayer.submit.delay(abs, -3).get(timeout=60))
"""


def run_python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


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


# -- nothing a user is given back shows the password -------------------------------------------------

def _worker_and_job():
    return repr(gpulayer.current_worker()) + str(gpulayer.current_worker()) + repr(gpulayer.current_job())


def _raises_with_the_url():
    raise RuntimeError(f"cannot reach {os.environ['GPULAYER_BROKER_URL']}")


def _rank_says_where():
    return os.environ["RANK"]


def test_nothing_a_user_gets_back_shows_the_password(fleet):
    """repr and str of everything a user gets back from the API, and the worker logs, never show the password;
    the connections themselves still use it."""
    from gpulayer import app as app_mod
    from gpulayer.config import load_settings
    from gpulayer.errors import ClusterUnavailable, ConfigError, JobFailed, JobRejected
    from gpulayer.local import LocalCluster
    from gpulayer.masking import mask_url
    from gpulayer.status import collect

    password = fleet.password
    shown: dict[str, object] = {}
    settings = fleet.connect()  # gpulayer.init(url, secret=...) returns the Settings a notebook cell prints
    shown["init()"] = settings
    shown["connect()"] = gpulayer.connect(load_settings(broker_url=fleet.url, secret=fleet.secret))
    assert settings.broker_url == fleet.url and password in settings.broker_url  # the real URL, whole
    assert f"broker_url='{mask_url(fleet.url)}'" in repr(settings) and ":***@" in str(settings)
    assert app_mod.app.conf.broker_url == fleet.url  # and it connects with it: the jobs below run

    h = gpulayer.submit.delay(_worker_and_job)
    shown["AsyncResult"], shown["current_worker/current_job in a job"] = h, h.get(timeout=60)
    batch = gpulayer.submit_batch([gpulayer.submit.s(abs, -i) for i in range(3)])
    shown["BatchHandle"], shown["batch results"] = batch, batch.get(timeout=60)
    job = distributed(_rank_says_where, nodes=1, procs_per_node=2, timeout=60)
    shown["GangHandle"], shown["gang results"] = job, job.get(timeout=120)
    shown["placement"], shown["gang status"] = job.placement, job.status()
    shown["WorkerInfo"] = app_mod.registry().snapshot()
    shown["status"] = collect()
    with pytest.raises(JobFailed) as failed:
        gpulayer.submit.delay(_raises_with_the_url).get(timeout=60)
    shown["JobFailed"], shown["JobFailed.message"] = failed.value, failed.value.message + failed.value.traceback
    assert ":***@" in failed.value.message  # the URL the job quoted, masked
    with pytest.raises(JobRejected) as rejected:
        gpulayer.submit.delay(abs, 1, resources=gpulayer.Resources(zone="nowhere-1a"))
    shown["JobRejected"] = rejected.value
    shown["ClusterUnavailable"] = ClusterUnavailable(f"cannot reach the broker at {fleet.url}; is it up?")
    shown["ConfigError"] = ConfigError(f"bad broker {fleet.url}")
    shown["LocalCluster"] = LocalCluster(broker_url=fleet.url, secret=fleet.secret, home=Path("/h"))

    leaks = [name for name, obj in shown.items() for text in (repr(obj), str(obj))
             if password in text or fleet.secret in text]
    assert not leaks, f"these show the password or the secret: {leaks}"
    assert ":***@" in str(shown["ClusterUnavailable"]) and ":***@" in repr(shown["ConfigError"])
    # The job ran (its worker and job context came back), and so did the gang.
    assert shown["gang results"] == ["0", "1"] and "w-" in shown["current_worker/current_job in a job"]

    # `gpulayer status` and every worker's log.
    out = subprocess.run([sys.executable, "-m", "gpulayer", "status", "--json"], capture_output=True, text=True,
                         env=dict(os.environ, GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret),
                         timeout=120)
    assert out.returncode == 0 and '"broker"' in out.stdout, out.stderr
    logs = {p.name: p.read_text(errors="replace") for p in fleet.workdir.glob("*.log")}
    assert len(logs) >= 2
    for name, text in {"status": out.stdout + out.stderr, **logs}.items():
        assert password not in text and fleet.secret not in text, f"{name} shows a secret"


def test_mask_url_and_the_log_filter():
    import logging

    from gpulayer.masking import MaskingFilter, mask_url

    assert mask_url("redis://:pw@10.0.0.1:6379/0") == "redis://:***@10.0.0.1:6379/0"
    assert mask_url("rediss://user:p%40ss@[::1]:6380/0?ssl_cert_reqs=none") == \
        "rediss://user:***@[::1]:6380/0?ssl_cert_reqs=none"
    assert mask_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0" and mask_url(None) is None

    try:
        raise ConnectionError("lost redis://:pw-in-a-traceback@h:1/0")
    except ConnectionError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "to %s with %s", ("redis://:pw1@h/0", "s3cr3t"),
                                   sys.exc_info())
    assert MaskingFilter(["s3cr3t"]).filter(record)
    line = logging.Formatter().format(record)
    assert "to redis://:***@h/0 with ***" in line and "redis://:***@h:1/0" in line
    assert "pw1" not in line and "s3cr3t" not in line and "pw-in-a-traceback" not in line
