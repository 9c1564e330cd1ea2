"""A lost broker, said plainly: the embedded cluster restarts its Redis, and every client call says `ClusterUnavailable`.

These assert sequences, never speeds: the only clock in them is a hang guard far above each call's timeout (a
call that ignored its timeout would wait Celery's retries out: 20 s to hours).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import gpulayer
from gpulayer import distributed, group, submit, submit_batch
from gpulayer.cancel import unfinished
from gpulayer.config import read_state
from gpulayer.errors import ClusterUnavailable
from gpulayer.lab.fleet import Fleet, wait_until
from gpulayer.local.supervisor import RESTART_LIMIT, RedisDeaths, describe_restarts
from tests.fleets import need_redis

HANG_GUARD = 30.0  # seconds past a call's own timeout: far beyond any wait it should do


def run_cli(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "gpulayer", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or dict(os.environ))


def raises_unavailable(call, timeout: float) -> str:
    """``call()`` raises ClusterUnavailable (not a TimeoutError, redis-py's or Celery's error) well within
    ``timeout`` + the hang guard; its message."""
    start = time.monotonic()
    with pytest.raises(ClusterUnavailable) as caught:
        call()
    assert time.monotonic() - start < timeout + HANG_GUARD, "the call hung past its timeout"
    return str(caught.value)


def test_redis_deaths_restart_until_five_within_a_minute():
    deaths = RedisDeaths(limit=5, window=60.0)
    assert [deaths.died(-9) for _ in range(5)] == [True, True, True, True, False]
    assert deaths.record()["restarts"] == 4 and deaths.record()["last_exit"] == -9
    spread = RedisDeaths(limit=2, window=0.0)  # deaths a window apart never add up
    assert spread.died(1) and spread.died(1) and spread.died(1)
    assert describe_restarts({"restarts": 0}) is None
    line = describe_restarts({"restarts": 1, "last_exit": -9, "last_at": time.time()})
    assert line.startswith("restarted 1 time (last: exited -9 at ") and line.endswith(")")


def test_the_embedded_redis_killed_mid_batch_restarts_and_the_batch_completes(gpulayer_home):
    """SIGKILL of the embedded Redis during a 1,000-job batch: it is started again from its append-only file,
    every result comes back right, `gpulayer status` shows the restart; killed RESTART_LIMIT times in a row,
    the cluster stops and says why (status, and the next client call)."""
    need_redis()
    from gpulayer.local import down, up

    cluster, started = up(workers=2, slots=2, home=gpulayer_home)
    assert started
    state_file = gpulayer_home / "cluster.json"
    try:
        gpulayer.init()

        def job(i):
            import time as _t

            _t.sleep(0.005)
            return i * i

        batch = submit_batch([submit.s(job, i) for i in range(1000)])
        single = submit.delay(job, 3)
        waiting = ThreadPoolExecutor(1).submit(single.get, timeout=120)  # waiting on its channel through the kill
        wait_until(lambda: len(unfinished(batch.ids)) <= 950, 120, "50 jobs of the batch to finish")
        first = json.loads(state_file.read_text())
        left = len(unfinished(batch.ids))
        os.kill(first["redis_pid"], signal.SIGKILL)
        assert left > 0 and not waiting.done(), "the batch ended before Redis was killed: make its jobs longer"
        assert batch.get(timeout=120) == [i * i for i in range(1000)]
        assert waiting.result(timeout=120) == 9  # the get() rode out the restart (no Celery RuntimeError)
        assert submit.delay(job, 7).get(timeout=60) == 49  # the workers and this client reconnected
        after = json.loads(state_file.read_text())
        assert after["redis_pid"] != first["redis_pid"] and after["redis"]["restarts"] == 1
        assert after["redis"]["last_exit"] == -signal.SIGKILL

        st = run_cli("status")
        assert st.returncode == 0, st.stderr
        assert "redis: restarted 1 time (last: exited -9 at " in st.stdout, st.stdout
        assert json.loads(run_cli("status", "--json").stdout)["broker_restarts"]["restarts"] == 1

        # Killed again and again: after RESTART_LIMIT deaths within a minute it is left dead, and the cluster says so.
        kills = 1
        while (state := read_state(state_file)) is not None and kills < 2 * RESTART_LIMIT:
            os.kill(state["redis_pid"], signal.SIGKILL)
            kills += 1
            wait_until(lambda: (now := read_state(state_file)) is None or
                       now["redis_pid"] != state["redis_pid"] and _pings(cluster.broker_url), 60,
                       "the supervisor to restart Redis, or to stop")
        assert read_state(state_file) is None and RESTART_LIMIT <= kills < 2 * RESTART_LIMIT
        gone = run_cli("status")
        assert gone.returncode == 2
        assert f"its Redis died {RESTART_LIMIT} times within 60 s" in gone.stderr, gone.stderr
        message = raises_unavailable(lambda: submit.delay(job, 1), app_settings().connect_timeout)
        assert f"its Redis died {RESTART_LIMIT} times" in message and ":***@127.0.0.1:" in message
        assert "redis.log" in message and "gpulayer up" in message
    finally:
        down(gpulayer_home)


def _pings(url: str) -> bool:
    from gpulayer.store.connection import connect_redis

    client = connect_redis(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


def app_settings():
    from gpulayer import app as app_mod

    return app_mod.settings()


def sleeper(seconds):
    import time as _t

    _t.sleep(seconds)
    return seconds


def test_with_the_broker_gone_every_client_call_says_cluster_unavailable(tmp_path):
    need_redis()
    with Fleet(tmp_path / "f", torch=False) as fleet:
        fleet.add_worker("b1", slots=3)
        fleet.connect()
        running = submit.delay(sleeper, 60)
        batch = submit_batch([submit.s(sleeper, 0.01) for _ in range(10)] + [submit.s(sleeper, 60)])
        wait_until(lambda: len(unfinished(batch.ids)) == 1, 60, "all but the batch's last job to finish")
        with pytest.raises(TimeoutError, match="10 of 11 jobs finished"):  # the broker is there: a plain timeout
            batch.get(timeout=0.5)
        gang = distributed(sleeper, 60, nodes=1, procs_per_node=1, warm=False)
        assert list(gang.placement.workers) == ["b1"]  # running, on the third slot
        grouped = group(submit.s(sleeper, 60) for _ in range(2)).apply_async()  # queued
        fleet.stop_redis()  # for good

        masked, secret = ":***@127.0.0.1:", fleet.password
        message = raises_unavailable(lambda: running.get(timeout=2), 2)
        assert masked in message and secret not in message and running.id in message
        message = raises_unavailable(lambda: batch.get(timeout=2), 2)
        assert "11 jobs sent, 10 finished" in message and masked in message
        message = raises_unavailable(lambda: grouped.get(timeout=2), 2)
        assert "a group of 2 jobs" in message and masked in message
        message = raises_unavailable(lambda: gang.get(timeout=2), 2)
        assert f"distributed job {gang.id}" in message and masked in message
        message = raises_unavailable(lambda: submit.delay(sleeper, 1), app_settings().connect_timeout)
        assert "was not sent" in message and masked in message
        message = raises_unavailable(lambda: submit_batch([submit.s(sleeper, 1)]), 0)
        assert "batch" in message and masked in message
        message = raises_unavailable(lambda: distributed(sleeper, 1, nodes=1, procs_per_node=1), 0)
        assert "was not started" in message and masked in message
        message = raises_unavailable(running.cancel, app_settings().connect_timeout)
        assert "nothing was cancelled" in message and masked in message
        message = raises_unavailable(batch.cancel, app_settings().connect_timeout)
        assert "nothing was cancelled" in message and masked in message
        message = raises_unavailable(running.history, app_settings().connect_timeout)
        assert f"the history of job {running.id}" in message and masked in message
        from gpulayer.status import collect

        message = raises_unavailable(collect, 0)
        assert "gpulayer status" in message and masked in message and "start the broker again" in message
        st = run_cli("status", env={**os.environ, "GPULAYER_BROKER_URL": fleet.url, "GPULAYER_SECRET": fleet.secret})
        assert st.returncode == 2 and masked in st.stderr and secret not in st.stderr, st.stderr
        fleet.stop_workers(grace=1)  # their jobs have no broker to report to: nothing to wait for
