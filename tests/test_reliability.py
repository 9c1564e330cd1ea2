"""Reliability: broker restarts, forged messages, cancel and timeouts, results stored once."""

from __future__ import annotations

import base64
import json
import os
import pickle
import re
import time
import uuid

import pytest

import gpulayer
from gpulayer import JobFailed, Resources, queues, submit, submit_batch
from gpulayer.lab.fleet import Fleet


def tiny(i, seconds=0.02):
    import time as _t

    _t.sleep(seconds)
    return i


def test_redis_restart_loses_no_submitted_job(tmp_path):
    with Fleet(tmp_path / "f", appendonly=True, torch=False) as fleet:
        fleet.add_worker("r1", slots=2)
        fleet.add_worker("r2", slots=2)
        fleet.connect()
        batch = submit_batch([submit.s(tiny, i, 0.03) for i in range(400)])
        singles = [submit.delay(tiny, 1000 + i) for i in range(100)]
        time.sleep(1.0)
        fleet.stop_redis()  # SHUTDOWN: the append-only file is flushed
        time.sleep(1.0)
        fleet.start_redis()  # same port, same data directory
        assert batch.get(timeout=240) == list(range(400))
        assert [s.get(timeout=240) for s in singles] == [1000 + i for i in range(100)]
        # The workers reconnected by themselves and take new work.
        assert submit.delay(tiny, 7).get(timeout=60) == 7


class Tripwire:
    """Unpickling this writes a file: proof that code in a message ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def forged_message(queue: str, body: bytes) -> str:
    job_id = str(uuid.uuid4())
    return json.dumps({
        "body": base64.b64encode(body).decode(), "content-encoding": "binary",
        "content-type": gpulayer.signing.CONTENT_TYPE,
        "headers": {"lang": "py", "task": "gpulayer.submit", "id": job_id, "root_id": job_id, "parent_id": None,
                    "group": None, "origin": "intruder@elsewhere", "argsrepr": "x", "kwargsrepr": "{}",
                    "retries": 0, "eta": None, "expires": None, "timelimit": [None, None]},
        "properties": {"correlation_id": job_id, "reply_to": "x", "delivery_mode": 2,
                       "delivery_info": {"exchange": queue, "routing_key": queue}, "priority": 0,
                       "body_encoding": "base64", "delivery_tag": str(uuid.uuid4())},
    })


def test_forged_unsigned_and_tampered_messages_run_no_code(fleet, tmp_path):
    queue = queues.private("w-c")
    marker = str(tmp_path / "pwned")
    payload = pickle.dumps(((Tripwire(marker),), {}, {}))
    good = gpulayer.signing.dumps(((Tripwire(marker),), {}, {}))
    bodies = {
        "unsigned": payload,
        "wrong key": b"GL1" + b"\x00" * 32 + payload,
        "tampered": good[:-1] + bytes([good[-1] ^ 1]),
    }
    client = fleet.client()
    for body in bodies.values():
        client.lpush(queue, forged_message(queue, body))
    # The worker refused them and carries on: a real job on the same worker runs.
    assert submit.delay(tiny, 5, resources=Resources(worker_ids=["w-c"])).get(timeout=60) == 5
    deadline = time.monotonic() + 10
    while client.llen(queue) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.llen(queue) == 0
    assert not os.path.exists(marker), "a forged message ran code"
    log = (fleet.workdir / "w-c.log").read_text()
    assert log.count("refused without unpickling it") >= 3
    assert "intruder@elsewhere" in log  # the origin is logged
    for path in fleet.workdir.glob("*.log"):  # every worker's log and Redis's: no secret, no broker password
        text = path.read_text(errors="replace")
        assert fleet.secret not in text and fleet.password not in text, path.name
    client.close()


def spawn_and_sleep(key):
    import subprocess
    import time as _t

    child = subprocess.Popen(["sleep", "120"])
    gpulayer.app.redis_client().set(key, child.pid)
    _t.sleep(120)


def wait_for_key(client, key, timeout=60):
    deadline = time.monotonic() + timeout
    while client.get(key) is None:
        assert time.monotonic() < deadline, f"{key} never appeared"
        time.sleep(0.05)
    return int(client.get(key))


def pid_gone(pid, timeout=10):
    import psutil

    deadline = time.monotonic() + timeout
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_cancel_kills_a_running_jobs_process_tree(fleet):
    key = f"test:child:{uuid.uuid4()}"
    h = submit.delay(spawn_and_sleep, key, resources=Resources(worker_ids=["w-b"]))
    client = fleet.client()
    child = wait_for_key(client, key)
    h.cancel()
    with pytest.raises(JobFailed, match="cancelled") as e:
        h.get(timeout=60)
    assert e.value.type_name == "JobStopped"  # whether the revoke or the reaper's kill was recorded first
    assert pid_gone(child), "the job's subprocess outlived the cancel"
    assert submit.delay(tiny, 3, resources=Resources(worker_ids=["w-b"])).get(timeout=60) == 3
    client.close()


def test_cancel_drops_a_queued_job(fleet):
    key = f"test:ran:{uuid.uuid4()}"
    blocker = submit.delay(tiny, 0, 3.0, resources=Resources(worker_ids=["w-c"]))  # w-c has one slot
    queued = submit.delay(lambda: gpulayer.app.redis_client().set(key, 1), resources=Resources(worker_ids=["w-c"]))
    queued.cancel()
    with pytest.raises(JobFailed, match="cancelled before it ran") as e:
        queued.get(timeout=60)
    assert e.value.type_name == "JobStopped"
    blocker.get(timeout=60)
    assert fleet.client().get(key) is None, "a cancelled queued job ran"


def set_key_and_sleep(key):
    import time as _t

    gpulayer.app.redis_client().set(key, 1)
    _t.sleep(120)


def test_a_revoke_says_whether_the_job_had_started(fleet):
    key = f"test:started:{uuid.uuid4()}"
    on_c = Resources(worker_ids=["w-c"])  # one slot: the second job waits behind the first
    running = submit.delay(set_key_and_sleep, key, resources=on_c)
    queued = submit.delay(tiny, 1, resources=on_c)
    wait_for_key(fleet.client(), key)
    queued.revoke(terminate=True)
    running.revoke(terminate=True)
    with pytest.raises(JobFailed) as ran:
        running.get(timeout=60)
    assert ran.value.type_name == "JobStopped"
    assert re.fullmatch(r"job cancelled: stopped while running \(after \d+\.\d s\)", ran.value.message)
    with pytest.raises(JobFailed) as never:
        queued.get(timeout=60)
    assert never.value.type_name == "JobStopped" and never.value.message.startswith("job cancelled before it ran")


def test_timeout_kills_the_job_and_says_so(fleet):
    key = f"test:child:{uuid.uuid4()}"
    h = submit.delay(spawn_and_sleep, key, timeout=1.5, resources=Resources(worker_ids=["w-a"]))
    child = wait_for_key(fleet.client(), key)
    with pytest.raises(JobFailed, match="ran over its 1.5s timeout"):
        h.get(timeout=60)
    assert pid_gone(child)
    with pytest.raises(ValueError, match="timeout must be a positive"):
        submit.delay(tiny, 1, timeout=-1)


def stamp():
    import time as _t

    return _t.time()


def test_a_stored_result_is_never_overwritten(fleet):
    job_id = str(uuid.uuid4())
    first = submit.apply_async((stamp,), task_id=job_id).get(timeout=60)
    submit.apply_async((stamp,), task_id=job_id)  # the same job again, e.g. a duplicate delivery
    time.sleep(1.0)
    assert submit.AsyncResult(job_id).get(timeout=60) == first


def test_a_worker_beyond_loopback_without_a_password_is_refused(monkeypatch):
    from gpulayer.errors import ConfigError
    from gpulayer.worker.main import run_worker

    monkeypatch.setenv("GPULAYER_SECRET", "x")
    with pytest.raises(ConfigError, match="no password"):
        run_worker(broker="redis://10.231.0.1:6379/0")  # refused before any connection is tried


def test_a_fleet_refuses_a_second_redis_while_its_first_runs(tmp_path):
    with Fleet(tmp_path / "f") as fleet:
        first = fleet.redis_proc
        with pytest.raises(RuntimeError, match="already running"):
            fleet.start_redis()
        assert fleet.redis_proc is first and first.poll() is None
        fleet.stop_redis()
        fleet.start_redis()  # a restart, as test_redis_restart_loses_no_submitted_job does
        assert fleet.redis_proc is not first and fleet.redis_proc.poll() is None
    assert first.poll() is not None
