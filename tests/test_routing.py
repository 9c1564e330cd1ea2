"""Capability routing against live workers: land where it can run, or be refused at once."""

from __future__ import annotations

import time

import pytest

import gpulayer
from gpulayer import JobRejected, Resources, group, submit, submit_batch
from gpulayer.app import redis_client


def where():
    w = gpulayer.current_worker()
    return w.id, w.zone, w.region


def queued_messages(fleet) -> int:
    c = fleet.client()
    try:
        return sum(c.llen(k) for k in c.scan_iter("gl.q.*"))
    finally:
        c.close()


def test_cuda_on_cpu_fleet_is_refused_at_once_naming_cuda(fleet):
    before = queued_messages(fleet)
    # Refused by the router from the registry snapshot: raised by delay() itself, not by a
    # get() that waits for a worker (pytest-timeout would catch a wait).
    with pytest.raises(JobRejected) as e:
        submit.delay(where, resources=Resources(cuda=True))
    assert "CUDA" in str(e.value) and "w-a" in str(e.value)
    with pytest.raises(JobRejected, match="CUDA"):
        submit_batch([submit.s(where)], resources=Resources(cuda=True))
    with pytest.raises(JobRejected, match="CUDA"):
        group(submit.s(where, resources=Resources(cuda=True)) for _ in range(3)).apply_async()
    assert queued_messages(fleet) == before, "a refused job must never reach a queue"


def test_pinned_jobs_run_on_that_worker(fleet):
    for wid in ("w-a", "w-c"):
        hs = [submit.delay(where, resources=Resources(worker_ids=[wid])) for _ in range(10)]
        assert {h.get(timeout=30)[0] for h in hs} == {wid}
    b = submit_batch([submit.s(where) for _ in range(10)], resources=Resources(worker_ids=["w-b"]))
    assert {r[0] for r in b.get(timeout=30)} == {"w-b"}


def test_zone_jobs_run_only_in_that_zone(fleet):
    b = submit_batch([submit.s(where) for _ in range(40)], resources=Resources(zone="europe-west1-c"))
    assert {r[1] for r in b.get(timeout=60)} == {"europe-west1-c"}
    hs = [submit.apply_async((where,), {"resources": Resources(zone="us-central1-a")}) for _ in range(10)]
    assert {h.get(timeout=30)[0] for h in hs} == {"w-c"}


def test_region_jobs_stay_in_the_region(fleet):
    b = submit_batch([submit.s(where) for _ in range(40)], resources={"region": "europe-west1"})
    assert {r[2] for r in b.get(timeout=60)} == {"europe-west1"}


def test_unknown_zone_and_worker_are_refused_with_suggestions(fleet):
    with pytest.raises(JobRejected, match=r"did you mean .*'europe-west1-b'"):
        submit.delay(where, resources=Resources(zone="europe-west1-x"))
    with pytest.raises(JobRejected, match=r"no live worker named 'w-z'"):
        submit.delay(where, resources=Resources(worker_ids=["w-z"]))


def test_dead_worker_leaves_the_registry_and_routing(fresh_fleet):
    fresh_fleet.add_worker("solo", zone="z1")
    fresh_fleet.add_worker("other", zone="z2")
    fresh_fleet.connect()
    assert submit.delay(where, resources=Resources(zone="z1")).get(timeout=30)[0] == "solo"
    fresh_fleet.stop_worker("solo")  # clean stop deregisters at once
    # A client routes on its view of the fleet, reused for up to registry_cache_seconds (a stop that fast may
    # fall inside it): past that, the next submit reads the registry again and sees the worker gone.
    time.sleep(gpulayer.app.settings().registry_cache_seconds)
    with pytest.raises(JobRejected, match="zone 'z1'"):
        submit.delay(where, resources=Resources(zone="z1"))
    assert {w.id for w in gpulayer.app.registry().snapshot()} == {"other"}
    redis_client().close()
