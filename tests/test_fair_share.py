"""Fair share and quotas on a real Redis with real workers (gpulayer/store/fair.py, store/lua/take.lua)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from gpulayer import status, submit
from gpulayer.app import redis_client
from gpulayer.fairshare import Policy
from gpulayer.store import fair, keys
from gpulayer.deadline import wait_until


def span(seconds: float):
    import time as _t

    start = _t.time()
    _t.sleep(seconds)
    return start, _t.time()


def as_user(user: str, seconds: float):
    return submit.apply_async((span, seconds), headers={"gl_client": user})


def set_policies(client, **users: Policy) -> None:
    client.hset(keys.USERS, mapping={u: json.dumps({"share": p.share, "max_slots": p.max_slots,
                                                   "max_gpus": p.max_gpus, "max_gangs": p.max_gangs,
                                                   "priority": p.priority, "sig": "ignored"})
                                    for u, p in users.items()})
    fair.forget()


def most_at_once(spans) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    now = best = 0
    for _, d in edges:
        now += d
        best = max(best, now)
    return best


def test_a_quota_of_slots_is_never_exceeded_and_the_job_waits_with_its_reason(fresh_fleet):
    fleet = fresh_fleet
    fleet.add_workers({"fq": dict(slots=4, torch=False)})
    fleet.connect()
    client = redis_client()
    set_policies(client, alice=Policy(max_slots=2))
    handles = [as_user("alice", 0.3) for _ in range(12)]
    seen, reasons, rows, done = [], set(), [], threading.Event()

    def sample():
        while not done.is_set():
            seen.append(int(client.hget(keys.FAIR_RUNNING, "slots:alice") or 0))
            reason = client.hget(keys.FAIR_WAITING, "alice")
            if reason:
                reasons.add(reason.decode())
            if not rows:  # what `gpulayer status` shows while alice's jobs wait
                row = next(r for r in status.collect()["fair_share"] if r["user"] == "alice")
                if row["waiting"] and row["reason"] and "quota" in row["reason"]:
                    rows.append(row)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        spans = [h.get(timeout=120) for h in handles]
    finally:
        done.set()
        sampler.join()
    assert most_at_once(spans) <= 2 and max(seen) <= 2
    assert max(seen) == 2 and most_at_once(spans) == 2  # the quota was reached, so it was what held them back
    assert "alice: 2 of 2 slots in use (quota)" in reasons
    assert rows and rows[0]["reason"] == "alice: 2 of 2 slots in use (quota)" and rows[0]["max_slots"] == 2
    assert "alice: 2 of 2 slots in use (quota)" in "\n".join(x.text() for x in status.renderables(
        {**status.collect(), "fair_share": rows}))
    wait_until(lambda: int(client.hget(keys.FAIR_RUNNING, "slots:alice") or 0) == 0, 10, "alice's slots back")
    assert client.hlen(keys.FAIR_TAKEN) == 0
    usage = float(client.hget(keys.FAIR_USAGE, "u:alice"))
    assert 12 * 0.3 <= usage < 12 * 0.3 + 10  # slot-seconds charged as the jobs ended


def test_the_user_furthest_below_its_share_gets_the_contended_slot(fresh_fleet):
    fleet = fresh_fleet
    fleet.add_workers({"fs": dict(slots=1, torch=False)})
    fleet.connect()
    client = redis_client()
    set_policies(client, alice=Policy(share=1), bob=Policy(share=1))
    client.hset(keys.FAIR_USAGE, mapping={"u:bob": 1000.0, "at:bob": time.time()})  # bob used far more
    pid = fleet.workers["fs"].pid
    os.kill(pid, signal.SIGSTOP)  # both backlogs wait before the worker takes anything
    try:
        bobs = [as_user("bob", 0.05) for _ in range(3)]
        alices = [as_user("alice", 0.05) for _ in range(3)]
        assert client.llen(keys.user_queue("gl.q.cpu", "bob")) == 3  # each user's list of the queue
        assert client.llen(keys.user_queue("gl.q.cpu", "alice")) == 3
    finally:
        os.kill(pid, signal.SIGCONT)
    alice_starts = [h.get(timeout=60)[0] for h in alices]
    bob_starts = [h.get(timeout=60)[0] for h in bobs]
    assert max(alice_starts) < min(bob_starts)  # bob, sent first, waited for alice (below her share)


def test_without_policies_jobs_stay_in_the_queue_s_own_list(fresh_fleet):
    fleet = fresh_fleet
    fleet.add_workers({"fn": dict(slots=1, torch=False)})
    fleet.connect()
    client = redis_client()
    fair.forget()
    pid = fleet.workers["fn"].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        h = as_user("carol", 0.0)
        assert client.llen("gl.q.cpu") == 1 and not client.keys(f"*{keys.USER_SEP}*")
    finally:
        os.kill(pid, signal.SIGCONT)
    h.get(timeout=60)
    assert not client.exists(keys.FAIR_TAKEN, keys.FAIR_RUNNING, keys.FAIR_USAGE)


def blocks_until_released(key):
    import gpulayer

    assert gpulayer.app.redis_client().blpop([key], timeout=120), f"never released: {key}"
    return os.environ.get("RANK")


def test_a_distributed_job_over_its_users_gang_quota_waits_with_the_reason(fresh_fleet):
    import uuid

    from gpulayer import app as app_mod, distributed

    fleet = fresh_fleet
    fleet.add_workers({"fg": dict(slots=4, torch=False)})
    fleet.connect()
    client = redis_client()
    me = app_mod.client_identity()  # a distributed job's user: its spec's client
    set_policies(client, **{me: Policy(max_gangs=1, max_slots=3)})
    release = f"test:release:{uuid.uuid4().hex}"
    hold = distributed(blocks_until_released, release, nodes=1, procs_per_node=2, backend="gloo")
    hold.placement  # noqa: B018 (placed: running)
    held = fair.running_of(client.hgetall(keys.FAIR_RUNNING), me)
    assert (held.slots, held.gangs) == (2, 1)
    try:
        late = distributed(span, 0.0, nodes=1, procs_per_node=1, backend="gloo", timeout=300)
        wait_until(lambda: f"{me}: 1 of 1 distributed jobs in use (quota)" in late.status()["reason"], 30,
                   "the second distributed job to wait for its user's quota")
        assert late.status()["state"] == "waiting"
    finally:
        client.rpush(release, *["go"] * 2)
    hold.get(timeout=120)
    assert len(late.get(timeout=180)) == 1  # placed once the first one ended
    wait_until(lambda: fair.running_of(client.hgetall(keys.FAIR_RUNNING), me) == fair.Running(), 30,
               "the user's holds to end")
    assert not client.hkeys(keys.FAIR_TAKEN)
    assert float(client.hget(keys.FAIR_USAGE, f"u:{me}")) > 0  # its slot-seconds charged


def test_a_dead_workers_jobs_give_their_users_slots_back_when_they_are_requeued(fresh_fleet):
    fleet = fresh_fleet
    fleet.add_workers({"fd1": dict(slots=1, torch=False), "fd2": dict(slots=1, torch=False)})
    fleet.connect()
    client = redis_client()
    set_policies(client, alice=Policy(max_slots=2))
    handles = [as_user("alice", 2.0) for _ in range(2)]
    wait_until(lambda: int(client.hget(keys.FAIR_RUNNING, "slots:alice") or 0) == 2 and
               client.hlen(keys.FAIR_TAKEN) == 2, 30, "both jobs taken, one per worker")
    fleet.kill_worker("fd1", signal.SIGKILL)
    # fd2's janitor requeues fd1's job (its hold ends, charged), then runs it after its own
    spans = [h.get(timeout=120) for h in handles]
    assert len(spans) == 2
    wait_until(lambda: int(client.hget(keys.FAIR_RUNNING, "slots:alice") or 0) == 0, 30, "alice's slots back")
    assert client.hlen(keys.FAIR_TAKEN) == 0 and float(client.hget(keys.FAIR_RUNNING, "weight:alice")) == 0
