"""Workers die mid-run: every job still completes, exactly once, soon after the kill."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

import gpulayer
from gpulayer import queues, submit, submit_batch
from gpulayer.app import redis_client
from gpulayer.engine import delivery, transport
from gpulayer.store import keys
from gpulayer.store.jobs import JobRecords
from gpulayer.store.registry import Registry
from gpulayer.worker.janitor import bury

# torch=False: the jobs use no torch, so the workers (and each restart) skip importing it.
WORKERS = {n: dict(slots=2, zone="z", torch=False) for n in ("c1", "c2", "c3")}


def work(i: int, seconds: float, run: str):
    import os
    import time as _t

    r = gpulayer.app.redis_client()
    me = gpulayer.current_worker()
    r.rpush(f"{run}:started:{i}", f"{me.id}:{os.getpid()}:{_t.time()}")
    _t.sleep(seconds)
    return i, me.id, me.pid, _t.time()


def test_sigkilled_workers_lose_no_job_and_run_none_twice(fresh_fleet):
    kill_each_worker_mid_run(fresh_fleet)


def kill_each_worker_mid_run(fleet, n: int = 600, *, wait_restarted: bool = False) -> None:
    """The chaos case on ``fleet`` (Redis started, no workers): SIGKILL each worker of ``WORKERS`` in turn
    while ``n`` jobs run, restart it, and check every job completes exactly once, soon after the kill.

    ``wait_restarted``: the next kill waits until the restarted worker is back, so two live workers always
    remain to hand back and rerun what a kill cut off (where a busy machine makes restarts slow).
    """
    fleet.add_workers(WORKERS)
    fleet.connect()
    run = f"chaos:{time.time()}"
    rng = random.Random(7)
    batch = submit_batch([submit.s(work, i, rng.uniform(0.05, 0.5), run) for i in range(n)])

    kills = []  # (worker, main pid, time of the kill)
    for victim in ("c1", "c2", "c3"):
        time.sleep(4.0)
        proc = fleet.workers[victim]
        kills.append((victim, proc.pid, time.time()))
        fleet.kill_worker(victim, signal.SIGKILL)
        fleet.restart_worker(victim, wait=False)
        if wait_restarted:
            wait_for_life(fleet, victim)
    results = batch.get(timeout=600, propagate=True)  # none failed, or this raises

    assert [r[0] for r in results] == list(range(n)), "every job has exactly one result, in order"
    # Jobs cut off by a kill: started on the killed process, completed elsewhere within 10 s of the kill.
    client = redis_client()
    cut = 0
    for victim, pid, at in kills:
        for i, (_, wid, done_pid, done_at) in enumerate(results):
            starts = [s.decode().split(":") for s in client.lrange(f"{run}:started:{i}", 0, -1)]
            if any(w == victim and float(t) <= at for w, _, t in starts) and done_pid != pid and \
                    len(starts) > 1:
                cut += 1
                assert done_at - at <= 10.0, f"job {i} took {done_at - at:.1f}s after the kill of {victim}"
                history = JobRecords(client).history(batch.ids[i])
                assert any(h["event"] == "lost" for h in history), history
    assert cut >= 3, f"the kills cut off only {cut} running jobs; the test did not exercise recovery"
    client.close()


def wait_for_life(fleet, name: str, timeout: float = 120.0) -> None:
    """Until the worker ``name`` heartbeats from its current process (its last life stays live for a few
    seconds after a SIGKILL, so the name alone says nothing)."""
    pid = fleet.workers[name].pid
    client = fleet.client()
    deadline = time.monotonic() + timeout
    try:
        while not any(w.id == name and w.pid == pid for w in Registry(client).snapshot()):
            assert fleet.workers[name].poll() is None, f"worker {name} exited with {fleet.workers[name].returncode}"
            assert time.monotonic() < deadline, f"worker {name} (pid {pid}) did not register in {timeout}s"
            time.sleep(0.05)
    finally:
        client.close()


def test_poison_job_fails_after_bounded_deliveries_and_neighbours_finish(fleet):
    def poison():
        import os as _os

        _os._exit(3)

    pin = gpulayer.Resources(worker_ids=["w-a"])
    others = [submit.delay(work, i, 0.2, "poison", resources=pin) for i in range(6)]
    h = submit.delay(poison, resources=pin)
    with pytest.raises(gpulayer.JobFailed) as e:
        h.get(timeout=120)
    assert "died on all 3 deliveries (limit 3)" in e.value.message
    assert [o.get(timeout=120)[0] for o in others] == list(range(6))
    assert len([x for x in JobRecords(redis_client()).history(h.id) if x["event"] == "lost"]) == 3


def test_a_message_taken_by_a_worker_that_dies_at_once_goes_back_from_its_record(fresh_fleet):
    """A worker SIGKILLed right after its take: take.lua popped and recorded the message in one step, so it is
    in kombu's unacked hash with the worker's delivery record and nowhere else, and the janitor hands it back."""
    fleet = fresh_fleet
    fleet.add_workers({"t1": dict(slots=1, torch=False), "t2": dict(slots=1, torch=False)})
    fleet.connect()
    client = redis_client()
    t1, t2 = (keys.life(n, fleet.workers[n].pid) for n in ("t1", "t2"))
    for name in ("t1", "t2"):  # frozen: neither takes the job by itself
        os.kill(fleet.workers[name].pid, signal.SIGSTOP)
    try:
        h = submit.delay(work, 5, 0.0, f"taken:{time.time()}")
        assert client.llen(queues.DEFAULT) == 1
        # t1's take, as its transport does it (take.lua, recorded as it takes), then nothing: t1 dies.
        before = set(client.keys("*"))
        got = client.eval(transport.TAKE, 4, queues.DEFAULT, delivery.UNACKED, delivery.UNACKED_INDEX,
                          keys.inflight(t1), 1, time.time(), 0, 0)
        assert len(got) == 2 and client.llen(queues.DEFAULT) == 0 and client.hlen(keys.inflight(t1)) == 1
        assert set(client.keys("*")) - before <= {k.encode() for k in (delivery.UNACKED, delivery.UNACKED_INDEX,
                                                                       keys.inflight(t1))}
        fleet.kill_worker("t1", signal.SIGKILL)
    finally:
        os.kill(fleet.workers["t2"].pid, signal.SIGCONT)
    i, wid, _, _ = h.get(timeout=60)  # t2's janitor declares t1 dead and puts the message back
    assert (i, wid) == (5, "t2")
    assert client.hlen(keys.inflight(t1)) == 0
    deadline = time.time() + 10  # t2's record of the message goes with its ack
    while client.hlen(keys.inflight(t2)) and time.time() < deadline:
        time.sleep(0.1)
    assert client.hlen(keys.inflight(t2)) == 0 and JobRecords(client).losses(h.id) == 1  # t1's delivery
    client.close()


def test_burying_a_dead_life_leaves_the_new_life_of_the_same_worker_alone(fresh_fleet):
    """A janitor that judged an old life of a worker dead must not hand back what its new life holds."""
    fleet = fresh_fleet
    fleet.add_workers({"r1": dict(slots=1, torch=False), "r2": dict(slots=1, torch=False)})
    fleet.connect()
    client = redis_client()
    run = f"lives:{time.time()}"
    h = submit.delay(work, 1, 3.0, run)
    deadline = time.time() + 30
    while not client.llen(f"{run}:started:1"):
        assert time.time() < deadline, "the job never started"
        time.sleep(0.05)
    runner = client.lindex(f"{run}:started:1", 0).decode().split(":")[0]
    life = keys.life(runner, fleet.workers[runner].pid)
    assert client.hlen(keys.inflight(life)) == 1  # recorded with the take
    bury(gpulayer.app.app, client, runner, keys.life(runner, 1), "an earlier life stopped heartbeating", 3)
    assert h.get(timeout=60)[:2] == (1, runner)
    time.sleep(1.0)  # a message handed back by mistake would have started on the idle worker by now
    assert client.llen(f"{run}:started:1") == 1, "the running job was handed back and started again"
    client.close()
