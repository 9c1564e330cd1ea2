"""Distributed jobs on real workers: gang placement, the direct launcher and torchrun, fail-fast."""

from __future__ import annotations

import os
import time

import psutil
import pytest

import gpulayer
from gpulayer import JobFailed, JobRejected, Resources, distributed, submit
from gpulayer.app import redis_client
from gpulayer.store.gangs import GangStore
from gpulayer.lab.fleet import wait_until
from tests.fleets import running_fleet

GANG_FLEET = {
    "g1": dict(slots=2, zone="eu-1a", region="eu"),
    "g2": dict(slots=2, zone="eu-1a", region="eu"),
    "g3": dict(slots=2, zone="eu-1b", region="eu"),
    "g4": dict(slots=2, zone="us-1a", region="us"),
}


@pytest.fixture(scope="module")
def gang_fleet(tmp_path_factory):
    with running_fleet(tmp_path_factory.mktemp("gangs"), GANG_FLEET) as f:
        yield f


@pytest.fixture
def gangs(gang_fleet):
    gang_fleet.connect()
    yield gang_fleet
    # Every test leaves every slot free.
    wait_until(lambda: GangStore(redis_client()).held() == {}, 10, "every slot to be free after the test")


def allreduce_ranks():
    import torch
    import torch.distributed as dist

    gpulayer.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
             "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
             "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
             "OMP_NUM_THREADS", "GPULAYER_BACKEND")
    return {"sum": t.item(), "env": {n: os.environ.get(n) for n in names}, "worker": os.environ["GPULAYER_WORKER_ID"]}


@pytest.mark.parametrize("launcher", ["direct", "torchrun"])
def test_allreduce_2x2(gangs, launcher):
    job = distributed(allreduce_ranks, nodes=2, procs_per_node=2, launcher=launcher)
    out = job.get(timeout=180)
    assert [r["sum"] for r in out] == [6.0] * 4
    env = [r["env"] for r in out]
    assert [e["RANK"] for e in env] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in env] == ["0", "1", "0", "1"]
    assert [e["GROUP_RANK"] for e in env] == ["0", "0", "1", "1"]
    assert {e["WORLD_SIZE"] for e in env} == {"4"} and {e["LOCAL_WORLD_SIZE"] for e in env} == {"2"}
    assert {e["GROUP_WORLD_SIZE"] for e in env} == {"2"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in env}) == 1
    assert [r["worker"] for r in out][::2] == list(job.placement.workers)
    assert {e["GPULAYER_BACKEND"] for e in env} == {"gloo"}  # the job's backend, under either launcher
    if launcher == "direct":
        # node 0's worker hosts the store (it has torch imported): listening before any rank starts
        assert {e["TORCHELASTIC_USE_AGENT_STORE"] for e in env} == {"True"}
        assert {e["TORCHELASTIC_RUN_ID"] for e in env} == {job.id}
        assert {e["ROLE_NAME"] for e in env} == {"default"}
        assert [e["ROLE_RANK"] for e in env] == ["0", "1", "2", "3"]
        assert {e["OMP_NUM_THREADS"] for e in env} == {str(max(1, os.cpu_count() // 2))}
    else:
        assert {e["TORCHELASTIC_USE_AGENT_STORE"] for e in env} == {"True"}  # torchrun's agent hosts it
    assert job.status()["state"] == "succeeded"


def default_backend():
    import torch
    import torch.distributed as dist

    gpulayer.init_process_group()  # no backend named: the job's
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"backend": dist.get_backend(), "env": os.environ.get("GPULAYER_BACKEND"), "sum": t.item()}


def test_ranks_get_the_jobs_backend_as_init_process_groups_default(gangs):
    job = distributed(default_backend, nodes=1, procs_per_node=2, backend="gloo")
    assert job.spec.backend == "gloo"
    assert job.get(timeout=120) == [{"backend": "gloo", "env": "gloo", "sum": 2.0}] * 2


def test_nccl_without_cuda_is_refused_at_submission(gangs):
    with pytest.raises(ValueError, match="nccl.*CUDA"):
        distributed(default_backend, nodes=1, procs_per_node=2, backend="nccl")
    assert GangStore(redis_client()).held() == {}


def rank3_raises():
    import time as _t

    import torch
    import torch.distributed as dist

    gpulayer.init_process_group("gloo")
    r = gpulayer.app.redis_client()
    r.sadd(f"test:pids:{os.environ['TORCHELASTIC_RUN_ID']}", os.getpid())
    dist.barrier()
    if dist.get_rank() == 3:
        raise ValueError("rank three has a bad shard")
    dist.all_reduce(torch.ones(1))  # the others block here until they are stopped
    _t.sleep(120)


def test_one_rank_fails_every_rank_everywhere_stops(gangs):
    gpulayer.app.redis_client  # noqa: B018 (the ranks import gpulayer.app themselves)
    job = distributed(rank3_raises, nodes=2, procs_per_node=2)
    with pytest.raises(JobFailed) as e:
        job.get(timeout=180)
    err = e.value
    assert err.rank == 3 and err.type_name == "ValueError"
    assert "rank 3 on " in err.message and "bad shard" in err.message and job.placement.workers[1] in err.message
    assert "rank3_raises" in err.traceback and "ValueError: rank three has a bad shard" in err.traceback
    assert str(err).startswith(f"distributed job {job.id}: rank 3 on ") and "\n" not in str(err)
    assert "rank3_raises" in str(err.__cause__)  # Python's display shows the remote traceback as the cause
    pids = [int(p) for p in redis_client().smembers(f"test:pids:{job.id}")]
    assert len(pids) == 4
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    # Measured, not asserted (benchmarks/failstop.py reports it): failure to last rank stopped.
    store = GangStore(redis_client())
    failed_at = min(f["at"] for f in store.failures(job.id, 0))
    stopped = [n["stopped_at"] for n in store.nodes(job.id, 0).values()]
    print(f"all ranks stopped {max(stopped) - failed_at:.3f}s after rank 3 failed")
    assert job.status()["state"] == "failed"


def test_crash_without_exception_names_rank_and_exit_code(gangs):
    def hard_exit():
        gpulayer.init_process_group("gloo")
        import torch.distributed as dist

        if dist.get_rank() == 1:
            print("about to leave", flush=True)
            os._exit(9)
        dist.barrier()

    with pytest.raises(JobFailed) as e:
        distributed(hard_exit, nodes=1, procs_per_node=2).get(timeout=120)
    assert e.value.rank == 1 and e.value.exit_code == 9 and "exit code 9" in e.value.message


def test_gang_bigger_than_the_fleet_is_refused_at_once(gangs):
    with pytest.raises(JobRejected, match="needs 5 workers with 2 slots"):
        distributed(allreduce_ranks, nodes=5, procs_per_node=2)
    with pytest.raises(JobRejected, match="needs 2 workers with 3 slots"):
        distributed(allreduce_ranks, nodes=2, procs_per_node=3)
    with pytest.raises(JobRejected, match="CUDA"):
        distributed(allreduce_ranks, nodes=1, procs_per_node=1, resources=Resources(cuda=True))
    with pytest.raises(ValueError, match="nodes"):
        distributed(allreduce_ranks, nodes=0)
    with pytest.raises(ValueError, match="launcher"):
        distributed(allreduce_ranks, launcher="mpirun")


def test_locality_prefers_one_zone_then_one_region(gangs):
    job = distributed(allreduce_ranks, nodes=2, procs_per_node=2)
    assert set(job.placement.workers) == {"g1", "g2"}
    assert job.placement.reason == "placed on 2 workers in zone eu-1a"
    job.get(timeout=180)
    job = distributed(allreduce_ranks, nodes=3, procs_per_node=1)
    assert set(job.placement.workers) == {"g1", "g2", "g3"}
    assert job.placement.reason == "placed on 3 workers in region eu"
    job.get(timeout=180)


def test_pinned_gang_runs_on_exactly_the_named_workers(gangs):
    job = distributed(allreduce_ranks, nodes=2, procs_per_node=1, resources=Resources(worker_ids=["g4", "g3"]))
    out = job.get(timeout=180)
    assert set(job.placement.workers) == {"g3", "g4"} and {r["worker"] for r in out} == {"g3", "g4"}
    assert job.placement.reason.startswith("pinned to")


def sleepy_gang(seconds):
    import time as _t

    gpulayer.init_process_group("gloo")
    redis_client().rpush(f"test:running:{os.environ['GPULAYER_GANG_ID']}", os.environ["RANK"])  # see all_running
    start = _t.time()
    _t.sleep(seconds)
    return start, _t.time()


def gang_until_released(key):
    """Holds its slots until the test sets ``key`` (warm ranks start in milliseconds: no sleep is long enough)."""
    import time as _t

    gpulayer.init_process_group("gloo")
    r = gpulayer.app.redis_client()
    deadline = _t.monotonic() + 120
    while not r.exists(key) and _t.monotonic() < deadline:
        _t.sleep(0.02)


def test_two_gangs_that_cannot_both_fit_both_complete(gangs):
    a = distributed(sleepy_gang, 2.0, nodes=3, procs_per_node=2, timeout=300)
    b = distributed(sleepy_gang, 2.0, nodes=3, procs_per_node=2, timeout=300)
    ra, rb = a.get(timeout=300), b.get(timeout=300)
    # One ran after the other: their run windows do not overlap.
    a_start, a_end = min(s for s, _ in ra), max(e for _, e in ra)
    b_start, b_end = min(s for s, _ in rb), max(e for _, e in rb)
    assert a_end <= b_start or b_end <= a_start


def test_waiting_gang_shows_its_reason(gangs):
    release = f"test:release:{time.time()}"
    # max_restarts: on this 2-core VM gloo's connectFullMesh among 8 ranks has failed now and then ("Connection
    # closed by peer", 2026-12-02); the holder's start is not what this test is about.
    hold = distributed(gang_until_released, release, nodes=4, procs_per_node=2, max_restarts=1)
    hold.placement
    waiting = distributed(sleepy_gang, 0.1, nodes=1, procs_per_node=1)
    wait_until(lambda: "waiting for 1 workers with 1 free slots" in waiting.status()["reason"], 30,
               "the gang to wait for a free slot")
    assert waiting.status()["state"] == "waiting"
    redis_client().set(release, 1, ex=600)
    hold.get(timeout=120)
    waiting.get(timeout=120)


def count_concurrency(key):
    r = gpulayer.app.redis_client()
    now = r.incr(key)
    r.eval("if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[1]) then "
           "redis.call('SET', KEYS[2], ARGV[1]) end", 2, key, key + ":max", now)
    import time as _t

    _t.sleep(0.4)
    r.decr(key)


def test_reserved_slots_take_no_ordinary_jobs(gangs):
    key = f"test:conc:{time.time()}"
    job = distributed(gang_until_released, key + ":release", nodes=1, procs_per_node=1,
                      resources=Resources(worker_ids=["g4"]))
    job.placement  # reserved: one of g4's two slots
    # ... and held by g4 once its agent has the order (its heartbeat says so): a job taken before that instant
    # may use the slot, and the rank waits for it (docs/DISTRIBUTED.md, "Slots are real").
    wait_until(lambda: {w.id: w.held for w in gpulayer.app.registry().snapshot()}.get("g4") == 1, 30,
               "g4 to hold the gang's slot")
    hs = [submit.delay(count_concurrency, key, resources=Resources(worker_ids=["g4"])) for _ in range(5)]
    [h.get(timeout=60) for h in hs]
    redis_client().set(key + ":release", 1, ex=600)
    job.get(timeout=60)
    # Ordinary jobs kept flowing on g4's other slot, but never on the reserved one.
    assert int(redis_client().get(key + ":max")) == 1


def all_running(job) -> None:
    """Until every rank of a ``sleepy_gang`` job is in its sleep (its group is up)."""
    wait_until(lambda: redis_client().llen(f"test:running:{job.id}") == job.spec.world_size, 120,
               "every rank to be running")


def test_cancel_stops_the_ranks_and_frees_the_slots(gangs):
    job = distributed(sleepy_gang, 60.0, nodes=2, procs_per_node=1)
    all_running(job)
    job.cancel()
    with pytest.raises(JobFailed, match="cancelled"):
        job.get(timeout=30)
    assert job.status()["state"] == "cancelled"


def fails_first_time():
    gpulayer.init_process_group("gloo")
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0 and os.environ["RANK"] == "1":
        raise RuntimeError("flaky")
    return attempt


def test_max_restarts_restarts_the_whole_gang(gangs):
    job = distributed(fails_first_time, nodes=2, procs_per_node=1, max_restarts=1)
    assert job.get(timeout=180) == [1, 1]


def test_dead_worker_fails_its_gang(tmp_path):
    with running_fleet(tmp_path / "f", torch=False) as f:  # the ranks import torch themselves
        f.add_worker("d1", slots=1)
        f.add_worker("d2", slots=1)
        f.connect()
        job = distributed(sleepy_gang, 60.0, nodes=2, procs_per_node=1)
        victim = job.placement.workers[1]
        all_running(job)
        f.kill_worker(victim)
        with pytest.raises(JobFailed) as e:
            job.get(timeout=60)
        assert victim in e.value.message and ("stopped heartbeating" in e.value.message or "rank 1" in e.value.message)


def test_status_json_shows_workers_slots_and_a_waiting_gangs_reason(gangs):
    import json
    import subprocess
    import sys

    release = f"test:release:{time.time()}"
    hold = distributed(gang_until_released, release, nodes=4, procs_per_node=2)
    hold.placement
    waiting = distributed(sleepy_gang, 0.1, nodes=2, procs_per_node=2)
    wait_until(lambda: "waiting for 2 workers" in waiting.status()["reason"], 30, "the gang to wait for 2 workers")
    env = dict(os.environ, GPULAYER_BROKER_URL=gangs.url, GPULAYER_SECRET=gangs.secret)
    out = subprocess.run([sys.executable, "-m", "gpulayer", "status", "--json"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    live = {w.id: w for w in gpulayer.app.registry().snapshot()}
    assert {w["id"] for w in report["workers"]} == set(live)
    for w in report["workers"]:
        assert (w["zone"], w["region"], w["slots"]) == (live[w["id"]].zone, live[w["id"]].region, live[w["id"]].slots)
        assert w["held"] == 2  # the holding gang has every slot
    by_id = {g["id"]: g for g in report["gangs"]}
    assert by_id[hold.id]["state"] == "running" and sorted(by_id[hold.id]["workers"]) == ["g1", "g2", "g3", "g4"]
    assert by_id[waiting.id]["state"] == "waiting"
    assert "waiting for 2 workers with 2 free slots" in by_id[waiting.id]["reason"]
    assert gangs.secret not in out.stdout and "fleet-pw" not in out.stdout
    redis_client().set(release, 1, ex=600)
    hold.get(timeout=120)
    waiting.get(timeout=120)


def test_a_gang_node_judges_its_peers_by_the_configured_death_line(fresh_fleet, monkeypatch):
    """The lost-peer check reads one score per node, against worker_dead_after (here 30 s), not 5 s."""
    from gpulayer.models import GangSpec, WorkerInfo
    from gpulayer.store import keys
    from gpulayer.store.registry import Registry
    from gpulayer.gang import agent
    from gpulayer.procs import runtime

    client = fresh_fleet.client()
    try:
        monkeypatch.setattr(runtime, "registry", Registry(client, dead_after=30.0))  # what worker.main installs
        reg = Registry(client)
        reg.heartbeat_many([WorkerInfo(id=w, hostname="h", address="127.0.0.1") for w in ("n0", "n1")])
        order = {"spec": GangSpec(gang_id="g", nodes=2, procs_per_node=1).model_dump(mode="json"), "gang_id": "g",
                 "attempt": 0, "node_rank": 0, "workers": ["n0", "n1"]}
        run = agent.GangRun(order, WorkerInfo(id="n0", hostname="h", address="127.0.0.1"), fresh_fleet.url,
                            fresh_fleet.workdir / "root")
        try:
            secs, _ = client.time()
            client.zadd(keys.WORKERS, {"n1": secs - 10})  # silent 10 s: past 5, within 30
            assert run._lost_peer() is None
            client.zadd(keys.WORKERS, {"n1": secs - 40})
            assert run._lost_peer() == (1, "n1")
            reg.remove("n1")  # buried by a janitor
            assert run._lost_peer() == (1, "n1")
        finally:
            run.client.close()
    finally:
        client.close()


def prints_at_once():
    import sys

    print(f"hello from rank {os.environ['RANK']}", flush=True)
    print(f"warning from rank {os.environ['RANK']}", file=sys.stderr, flush=True)
    return int(os.environ["RANK"])


def test_on_output_gets_every_line_even_of_ranks_that_print_at_once(gangs):
    """Warm ranks print within milliseconds of placement: the output channel is subscribed before the gang starts,
    and ``get()`` returns after the last line was handed over."""
    lines = []
    job = distributed(prints_at_once, nodes=2, procs_per_node=2, on_output=lambda *line: lines.append(line))
    assert job.get(timeout=120) == [0, 1, 2, 3]
    for rank in range(4):
        assert (rank, "stdout", f"hello from rank {rank}") in lines
        assert (rank, "stderr", f"warning from rank {rank}") in lines


# --- waiting for slots, said (issue 31) --------------------------------------------------------------

def held_until(key):
    assert redis_client().blpop([key], 120), f"never released: {key}"


def test_wait_placement_gives_up_with_the_reason_and_placement_logs_it(fleet, caplog):
    import logging
    import threading
    import uuid

    from gpulayer import JobTimeout

    release = f"test:placement:{uuid.uuid4().hex}"
    hold = distributed(held_until, release, nodes=2, procs_per_node=2)  # w-a and w-b, the only 2-slot workers
    hold.placement  # noqa: B018
    job = distributed(held_until, release, nodes=2, procs_per_node=2, timeout=300)
    try:
        wait_until(job.waiting_for, 30, "the coordinator's reason")
        with pytest.raises(JobTimeout) as caught:
            job.wait_placement(timeout=0.3)
        text = str(caught.value)
        assert text.startswith(f"distributed job {job.id} was not placed within 0.3 s: waiting for 2 workers with 2 "
                               "free slots"), text
        assert "(#1 in line); it waits on in the cluster's line" in text and caught.value.job_id == job.id
        with caplog.at_level(logging.WARNING, logger="gpulayer.distributed_job"):
            placed = []
            waiter = threading.Thread(target=lambda: placed.append(job.placement), daemon=True)
            waiter.start()
            wait_until(lambda: caplog.records, 30, "the reason logged")
            assert caplog.records[0].getMessage().startswith(f"distributed job {job.id} is not placed yet: waiting "
                                                              "for 2 workers with 2 free slots")
            redis_client().rpush(release, *["go"] * 4)
            waiter.join(60)
        assert placed and len(placed[0].workers) == 2
    finally:
        redis_client().rpush(release, *["go"] * 8)
    hold.get(timeout=60)
    job.get(timeout=60)
    redis_client().delete(release)
