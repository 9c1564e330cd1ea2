"""The emulated fleet on a real Redis: it registers, takes jobs and gangs, and stops what it started."""

from __future__ import annotations

import time

import psutil
import pytest

from gpulayer import JobFailed, Resources, distributed, submit, submit_batch
from gpulayer.lab.emulator import EmulatedFleet, emulated_workers
from gpulayer.lab.emulator.jobs import REF
from gpulayer.placement import place_gang, route
from gpulayer.models import GangSpec
from gpulayer.store.registry import Registry

N = 300


@pytest.fixture
def emulated(fresh_fleet, tmp_path):
    fresh_fleet.connect()
    fleet = EmulatedFleet(fresh_fleet.url, fresh_fleet.secret, workers=N, processes=2, log_dir=tmp_path / "emu")
    fleet.start()
    try:
        fleet.wait_registered(timeout=120)
        yield fresh_fleet, fleet
    finally:
        pids = [p.pid for p in fleet.procs]
        fleet.stop()
        assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_emulated_workers_register_and_placement_sees_them(emulated):
    redis_fleet, fleet = emulated
    client = redis_fleet.client()
    try:
        snap = Registry(client).snapshot()
    finally:
        client.close()
    assert [w.id for w in snap] == sorted(w.id for w in emulated_workers(N))
    assert route(Resources(cuda=True, zone="emu-zone-05"), snap).eligible  # every fifth has GPUs
    p = place_gang(GangSpec(gang_id="g", nodes=4, procs_per_node=8, resources=Resources(cuda=True)), snap, {})
    assert len(p.workers) == 4 and p.reason.startswith("placed on 4 workers in zone")


def test_emulated_jobs_complete_with_their_results(emulated):
    hs = submit_batch([submit.s(REF, 0.01, i) for i in range(400)], resources=Resources(region="emu-region-2"))
    assert hs.get(timeout=120) == list(range(400))
    assert submit.delay(REF, 0.0, "pinned", resources=Resources(worker_ids=["emu-00007"])).get(timeout=60) == "pinned"
    with pytest.raises(JobFailed, match="runs no user code"):
        submit.delay(time.sleep, 0).get(timeout=60)


def test_emulated_gangs_succeed_and_fail_as_scripted(emulated):
    job = distributed(REF, 0.05, "ok", nodes=3, procs_per_node=2, resources=Resources(zone="emu-zone-01"), timeout=60)
    assert job.get(timeout=120) == ["ok"] * 6
    assert all(w.startswith("emu-") for w in job.placement.workers)
    bad = distributed(REF, 0.0, None, nodes=2, procs_per_node=2, fail_rank=3, exit_code=7, timeout=60)
    with pytest.raises(JobFailed, match="rank 3"):
        bad.get(timeout=120)


def test_stopping_the_emulators_takes_their_workers_out_of_the_registry(fresh_fleet, tmp_path):
    fleet = EmulatedFleet(fresh_fleet.url, fresh_fleet.secret, workers=50, processes=1, log_dir=tmp_path / "emu")
    with fleet:
        fleet.wait_registered(timeout=120)
    client = fresh_fleet.client()
    try:
        assert Registry(client).live_ids() == set()
    finally:
        client.close()
