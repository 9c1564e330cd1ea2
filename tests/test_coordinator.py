"""The gang coordinator on real workers: served outside the job slots, owner of the waiting gangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

import gpulayer
from gpulayer import JobRejected, Resources, distributed, submit
from gpulayer import signing
from gpulayer.app import redis_client
from gpulayer.gang import coordinator
from gpulayer.gang.consumer import read_message
from gpulayer.store import keys
from gpulayer.store.gangs import GangStore
from gpulayer.lab.fleet import wait_until
from tests.fleets import running_fleet

FLEET = {"c1": dict(slots=2, zone="co-1a", region="co"), "c2": dict(slots=2, zone="co-1a", region="co")}


@pytest.fixture(scope="module")
def coord_fleet(tmp_path_factory):
    with running_fleet(tmp_path_factory.mktemp("coord"), FLEET) as f:
        yield f


@pytest.fixture
def fleet2(coord_fleet, monkeypatch):
    coord_fleet.connect()
    # The client never runs the coordinator: a pass in this process fails the test.
    ran_here = []
    monkeypatch.setattr(coordinator, "one_pass", lambda client: ran_here.append(1) or [])
    yield coord_fleet
    assert not ran_here, "the client ran a coordinator pass itself"
    store = GangStore(redis_client())
    wait_until(lambda: not store.held() and not store.waiting(), 30, "every slot free and no gang waiting")


def blocks_until_released(key):
    """A job or rank that holds its slot until the test pushes a token to ``key``."""
    r = gpulayer.app.redis_client()
    assert r.blpop([key], timeout=120), f"never released: {key}"
    return os.environ.get("RANK", "job")


def stamped(value):
    import time as _t

    return value, _t.time()


def test_a_gang_is_placed_while_job_queues_are_backed_up_and_a_pool_is_full(fleet2):
    release = f"test:release:{uuid.uuid4().hex}"
    on_c1 = Resources(worker_ids=["c1"])
    jobs = [submit.delay(blocks_until_released, release, resources=on_c1) for _ in range(5)]
    client = redis_client()
    # c1's pool is full (2 running) and its queue backed up (3 waiting behind them).
    wait_until(lambda: client.llen("gl.q.w.c1") == 3 and client.llen(release) == 0 and
               {w.id: w.busy for w in gpulayer.app.registry().snapshot()}.get("c1") == 2, 60, "c1 full and backed up")
    free_gang = distributed(stamped, "c2", nodes=1, procs_per_node=2, resources=Resources(worker_ids=["c2"]))
    assert free_gang.placement.workers == ("c2",)
    behind = distributed(stamped, "c1", nodes=1, procs_per_node=2, resources=on_c1, timeout=300)
    # The coordinator ran (outside c1's full pool, with its queue backed up) and says why this one waits.
    wait_until(lambda: "waiting for 1 workers with 2 free slots" in behind.status()["reason"], 30,
               f"the coordinator's reason (now {behind.status()['reason']!r})")
    assert client.llen("gl.q.w.c1") == 3 and behind.status()["state"] == "waiting"
    assert [v for v, _ in free_gang.get(timeout=120)] == ["c2", "c2"]
    client.rpush(release, *["go"] * 5)
    assert [j.get(timeout=120) for j in jobs] == ["job"] * 5
    assert [v for v, _ in behind.get(timeout=120)] == ["c1", "c1"]
    client.close()


CLIENT_THAT_LEAVES = textwrap.dedent("""
    import sys
    import gpulayer
    from gpulayer import distributed

    def answer(x):
        import os
        return x * 10 + int(os.environ["RANK"])

    gpulayer.init(sys.argv[1], secret=sys.argv[2])
    job = distributed(answer, 4, nodes=2, procs_per_node=2, timeout=300)
    print(job.id, flush=True)
    # Leaves without waiting: the gang is the cluster's now.
""")


def test_a_waiting_gang_is_placed_and_runs_after_its_client_has_gone(fleet2, tmp_path):
    release = f"test:release:{uuid.uuid4().hex}"
    hold = distributed(blocks_until_released, release, nodes=2, procs_per_node=2)
    hold.placement  # noqa: B018 (every slot of the fleet is held)
    script = tmp_path / "leaves.py"
    script.write_text(CLIENT_THAT_LEAVES)
    out = subprocess.run([sys.executable, str(script), fleet2.url, fleet2.secret], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    gang_id = out.stdout.split()[-1]
    store = GangStore(redis_client())
    wait_until(lambda: store.record(gang_id)["reason"].startswith("waiting for 2 workers"), 30, "the waiting reason")
    assert store.record(gang_id)["state"] == "waiting"
    redis_client().rpush(release, *["go"] * 4)  # the holder ends; nobody is left to ask for the waiting gang
    assert hold.get(timeout=120) == ["0", "1", "2", "3"]
    rec = wait_until(lambda: (r := store.record(gang_id))["state"] in ("succeeded", "failed") and r, 120,
                     "the orphaned gang to end")
    assert rec["state"] == "succeeded", rec
    results = store.results(gang_id, 0)
    assert [signing.loads(results[r]) for r in range(4)] == [40, 41, 42, 43]


def test_waiting_gangs_are_placed_in_order_of_arrival_and_status_shows_their_place(fleet2):
    release = f"test:release:{uuid.uuid4().hex}"
    hold = distributed(blocks_until_released, release, nodes=2, procs_per_node=2)
    hold.placement  # noqa: B018
    first = distributed(stamped, "first", nodes=2, procs_per_node=2, timeout=300)
    second = distributed(stamped, "second", nodes=2, procs_per_node=2, timeout=300)
    for job in (first, second):
        wait_until(lambda: "waiting for 2 workers with 2 free slots" in job.status()["reason"], 30, "waiting reasons")
    env = {**os.environ, "GPULAYER_BROKER_URL": fleet2.url, "GPULAYER_SECRET": fleet2.secret, "COLUMNS": "250"}
    as_json = subprocess.run([sys.executable, "-m", "gpulayer", "status", "--json"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert as_json.returncode == 0, as_json.stderr
    gangs = {g["id"]: g for g in json.loads(as_json.stdout)["gangs"]}
    assert (gangs[first.id]["in_line"], gangs[second.id]["in_line"], gangs[hold.id]["in_line"]) == (1, 2, None)
    assert gangs[second.id]["state"] == "waiting" and "waiting for 2 workers" in gangs[second.id]["reason"]
    shown = subprocess.run([sys.executable, "-m", "gpulayer", "status"], env=env, capture_output=True, text=True,
                           timeout=60)
    row = next(ln for ln in shown.stdout.splitlines() if second.id[:12] in ln)
    assert "waiting (#2 in line)" in row and "waiting for 2 workers" in row, shown.stdout
    redis_client().rpush(release, *["go"] * 4)
    a, b = first.get(timeout=120), second.get(timeout=180)
    assert [v for v, _ in a] == ["first"] * 4 and [v for v, _ in b] == ["second"] * 4
    # Each needs the whole fleet: the first to arrive ran first, the second after it.
    assert max(t for _, t in a) < min(t for _, t in b)


def test_a_gang_that_waits_past_its_timeout_is_ended_by_the_cluster_with_its_reason(fleet2):
    release = f"test:release:{uuid.uuid4().hex}"
    hold = distributed(blocks_until_released, release, nodes=2, procs_per_node=2)
    hold.placement  # noqa: B018
    try:
        late = distributed(stamped, "late", nodes=1, procs_per_node=1, timeout=1.5)
        with pytest.raises(JobRejected, match=r"did not fit within 1.5s: waiting for 1 workers with 1 free slots"):
            late.get(timeout=60)
        rec = late.status()
        assert rec["state"] == "failed" and "did not fit within 1.5s" in rec["reason"]
        assert late.id not in GangStore(redis_client()).waiting()
    finally:
        redis_client().rpush(release, *["go"] * 4)
    hold.get(timeout=120)


def test_the_control_queue_runs_only_signed_coordinator_messages(fleet2):
    client = redis_client()
    # A message the signed serializer refuses, and a signed one for another task: neither runs anything.
    client.lpush("gl.q.control", json.dumps({"body": "e30=", "content-type": "application/json",
                                             "content-encoding": "utf-8", "headers": {"task": "x"},
                                             "properties": {"body_encoding": "base64"}}))
    wait_until(lambda: client.llen("gl.q.control") == 0, 30, "the control consumers to take it")
    with pytest.raises(Exception, match="untrusted content"):
        read_message(json.dumps({"body": "e30=", "content-type": "application/json", "content-encoding": "utf-8",
                                 "headers": {"task": "x"}, "properties": {"body_encoding": "base64"}}).encode())
    # A real coordinator message, as the client sends it, decodes to the coordinator and its gang.
    coordinator.coordinate.apply_async(("gang-x", 3), queue="gl.q.test-control-copy", ignore_result=True)
    raw = wait_until(lambda: client.rpop("gl.q.test-control-copy"), 30, "the copy")
    assert read_message(raw) == (coordinator.COORDINATE, ("gang-x", 3), {})
    client.delete(keys.bell("gl.q.test-control-copy"))
    client.close()


def where_on_attempt():
    """Attempt 0 blocks (its worker is killed under it); the restarted attempt says where it ran."""
    import time as _t

    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        _t.sleep(300)
    return os.environ["GPULAYER_WORKER_ID"], int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def test_a_gang_whose_worker_dies_restarts_on_live_workers_through_the_cluster(tmp_path):
    with running_fleet(tmp_path / "f", torch=False) as f:  # ranks that use no torch
        f.add_workers({"r1": dict(slots=1), "r2": dict(slots=1), "r3": dict(slots=1)})
        f.connect()
        job = distributed(where_on_attempt, nodes=2, procs_per_node=1, max_restarts=1)
        victim = job.placement.workers[1]
        client = redis_client()
        wait_until(lambda: client.exists(keys.gang_attempt(job.id, 0, "master")), 60, "node 0 to publish its address")
        f.kill_worker(victim)
        out = job.get(timeout=120)
        assert [attempt for _, attempt in out] == [1, 1]
        assert victim not in {w for w, _ in out} and len({w for w, _ in out}) == 2
        rec = job.status()
        assert rec["state"] == "succeeded" and rec["attempt"] == 1 and victim not in rec["placement"]["workers"]
        reports = GangStore(client).failures(job.id, 0)
        assert any(r["kind"] == "worker_lost" and r["worker"] == victim for r in reports)
        client.close()


def test_a_pass_asked_for_while_one_runs_is_not_lost(fresh_fleet, monkeypatch):
    """The second caller leaves its request to the pass under way, which goes round once more for it."""
    client, other = fresh_fleet.client(), fresh_fleet.client()
    try:
        client.zadd(keys.GANGS_WAITING, {"g": 1})
        passes, deferred = [], []

        def fake_pass(c):
            passes.append(c)
            if len(passes) == 1:  # while the first pass runs, a node gives slots back and asks
                deferred.append(coordinator.try_waiting(other))
            return []

        monkeypatch.setattr(coordinator, "one_pass", fake_pass)
        coordinator.try_waiting(client)
        assert deferred == [{"placed": [], "left_to": "the pass under way"}] and len(passes) == 2
        assert not client.exists(keys.COORDINATOR_LOCK) and not client.exists(keys.COORDINATOR_AGAIN)
        client.delete(keys.GANGS_WAITING)
        assert coordinator.try_waiting(client) == {"placed": []} and len(passes) == 2  # an empty line: no pass
    finally:
        client.close()
        other.close()
