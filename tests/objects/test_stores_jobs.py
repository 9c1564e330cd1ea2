"""The job path's must-shows on the stores a cluster of several hosts uses: S3-compatible storage (a real server
process, moto's, on loopback) and a shared directory. Two real workers, each with a temp root of its own
(``TMPDIR``), stand for two hosts: a put ref is written once and each host reads it once (an S3 object is copied
into each host's cache, counted in its record; a shared directory's file is mapped where it lies); large
arguments and results travel through the store, never through Redis, and go when forgotten."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
import torch

import gpulayer
from gpulayer import ObjectRef, submit
from gpulayer.lab.fleet import wait_until
from gpulayer.objects.backends import backend_for
from gpulayer.objects.cache import CACHE_DIR
from gpulayer.store.cluster import cluster_id, machine_root
from gpulayer.store.objects import ObjectRecords
from tests.fleets import running_fleet
from tests.objects.servers import s3_server, s3_url  # noqa: F401 (fixture)
from tests.test_objects_jobs import redis_growth

MiB = 2**20
WORKERS = ("s-a", "s-b")
# moto's server is plain Python: under a loaded CI machine a 200 MB upload and two downloads take minutes
pytestmark = pytest.mark.timeout(900)


def digest(t, pause: float = 0.0):
    time.sleep(pause)  # the 8 jobs spread over both workers' slots
    return gpulayer.current_worker().id, hashlib.sha256(memoryview(t.numpy())).hexdigest()


def filled(n: int, value: float):
    return torch.full((n,), value)


def described(t):
    return t.numel(), float(t[0]), float(t[-1])


@pytest.fixture(scope="module", params=["s3", "shared dir"])
def fleet(request, s3_server, tmp_path_factory):
    """Redis and two workers of two slots whose store (``GPULAYER_OBJECT_STORE``) is of the kind; this process
    uses the same store."""
    work = tmp_path_factory.mktemp("stores-jobs")
    url = s3_url() if request.param == "s3" else str(work / "shared")
    env = {"GPULAYER_OBJECT_STORE": url, **(s3_server.env() if request.param == "s3" else {})}
    patch = pytest.MonkeyPatch()
    for name, value in env.items():
        patch.setenv(name, value)
    try:
        with running_fleet(work / "fleet", {name: dict(slots=2, env=dict(os.environ)) for name in WORKERS}) as f:
            f.store = backend_for(url).url
            yield f
    finally:
        patch.undo()


@pytest.fixture
def connected(fleet):
    fleet.connect()
    return fleet


def stored(fleet) -> set[str]:
    return {name for name, _ in backend_for(fleet.store).list_old(-60)}


def test_a_put_ref_passed_to_8_jobs_on_2_workers_is_written_once_and_read_once_per_host(connected):
    fleet = connected
    t = torch.randn(50_000_000)  # 200 MB
    want = hashlib.sha256(memoryview(t.numpy())).hexdigest()
    before = stored(fleet)
    ref = gpulayer.put(t)
    assert stored(fleet) - before == {ref.oid}
    got = [h.get(timeout=600) for h in [submit.delay(digest, ref, 0.5) for _ in range(8)]]
    assert {d for _, d in got} == {want}  # every job saw the same values
    assert {w for w, _ in got} == set(WORKERS)
    assert stored(fleet) - before == {ref.oid}  # never written again

    record = ObjectRecords(fleet.client()).record(ref.oid)
    cid = cluster_id(fleet.client())
    copies = [machine_root(cid, fleet.worker_tmp(name)) / CACHE_DIR / ref.oid for name in WORKERS]
    if fleet.store.startswith("s3://"):
        assert int(record["fetches"]) == 2  # once per host, whatever its two pool processes did
        assert [p.stat().st_size for p in copies] == [ref.size, ref.size]
    else:
        assert int(record["fetches"]) == 0 and not any(p.exists() for p in copies)
    gpulayer.free(ref)
    assert stored(fleet) == before


def test_a_large_argument_and_result_travel_through_the_store_and_go_when_forgotten(connected):
    fleet = connected
    n = 12_500_000  # float32: 50 MB each way
    before = stored(fleet)
    with redis_growth(fleet) as grown:
        assert submit.delay(described, torch.full((n,), 3.0)).get(timeout=600) == (n, 3.0, 3.0)
        h = submit.delay(filled, n, 2.0)
        y = h.get(timeout=600)
    assert y.shape == (n,) and float(y[0]) == float(y[-1]) == 2.0
    assert grown["bytes"] < 5 * MiB, f"Redis grew by {grown['bytes'] / MiB:.1f} MiB"

    result = h.backend.get_task_meta(h.id)["result"]
    assert type(result) is ObjectRef and result.store == fleet.store
    wait_until(lambda: stored(fleet) - before == {result.oid}, 30, "the argument's object to go once its job ended")
    h.forget()
    assert stored(fleet) == before
    assert float(y.sum()) == 2.0 * n  # the value in hand outlives the object
