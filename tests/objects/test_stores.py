"""The object store through its API (``gpulayer.put / get / free``, the sweep) on each kind of store a cluster of
several hosts uses: S3-compatible storage (a real server process, moto's, on loopback) and a shared directory
(a plain path every host sees). "Hosts" are processes with temp roots of their own (``TMPDIR``), as workers on
different machines have: an S3 object is copied once into each host's cache, a shared directory's file is read
where it is."""

from __future__ import annotations

import base64
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
import torch

import gpulayer
from gpulayer.errors import ObjectMissing
from gpulayer.objects import lifetimes
from gpulayer.objects.backends import backend_for
from gpulayer.objects.cache import CACHE_DIR
from gpulayer.store.cluster import cluster_id, machine_root
from gpulayer.store.objects import ObjectRecords
from tests.fleets import running_fleet
from tests.objects.servers import s3_env, s3_server, s3_url  # noqa: F401 (fixtures)

# A "host": reads the ref it is given (a numpy array: no torch import, the processes start in a second) and prints
# the sum of the values it sees.
HOST = textwrap.dedent("""
    import base64, pickle, sys
    import gpulayer
    gpulayer.init()
    ref = pickle.loads(base64.b64decode(sys.argv[1]))
    print(float(gpulayer.get(ref).sum()))
""")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Redis only; this process's temp root is the module's own (the host cache of S3 objects read here)."""
    work = tmp_path_factory.mktemp("objects")
    patch = pytest.MonkeyPatch()
    (work / "client-tmp").mkdir()
    patch.setattr(tempfile, "tempdir", str(work / "client-tmp"))
    try:
        with running_fleet(work / "fleet", slots_free=False) as fleet:
            yield fleet
    finally:
        patch.undo()


@pytest.fixture(params=["s3", "shared dir"])
def store(request, cluster, s3_server, tmp_path, monkeypatch):
    """``GPULAYER_OBJECT_STORE`` set to a store of its own of the kind, this process connected; its URL. (The
    module's S3 server starts before the first test's process check, for either kind.)"""
    if request.param == "s3":
        request.getfixturevalue("s3_env")
        url = s3_url()
    else:
        url = str(tmp_path / "shared")  # a plain path, as a shared file system's mount point is given
    monkeypatch.setenv("GPULAYER_OBJECT_STORE", url)
    cluster.connect()
    return backend_for(url).url


def records(cluster) -> ObjectRecords:
    return ObjectRecords(cluster.client())


def stored(url: str) -> list[str]:
    """The objects the store's backend holds."""
    return sorted(name for name, _ in backend_for(url).list_old(-60))


def test_put_get_free(cluster, store):
    t = torch.randn(300_000)
    ref = gpulayer.put(t)
    assert ref.store == store and stored(store) == [ref.oid]
    assert torch.equal(gpulayer.get(ref), t)
    assert torch.equal(ref.get(), t)
    assert gpulayer.free(ref) == 1
    assert stored(store) == []
    assert records(cluster).record(ref.oid) is None
    with pytest.raises(ObjectMissing, match="gone from the object store"):
        gpulayer.get(ref)


def test_each_host_reads_an_object_once(cluster, store, tmp_path):
    t = np.arange(2_000_000, dtype=np.float64)
    ref = gpulayer.put(t)
    hosts = {name: tmp_path / name for name in ("host-a", "host-b")}
    arg = base64.b64encode(pickle.dumps(ref)).decode()
    procs = []
    for name, tmp in hosts.items():
        tmp.mkdir()
        env = dict(os.environ, TMPDIR=str(tmp), GPULAYER_BROKER_URL=cluster.url, GPULAYER_SECRET=cluster.secret,
                   GPULAYER_HOME=str(tmp_path / "home"))
        for _ in range(2):  # two processes per host at once, as a worker's pool processes: one copies, one waits
            procs.append(subprocess.Popen([sys.executable, "-c", HOST, arg], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-2000:] for _, err in outs]
    assert [float(out) for out, _ in outs] == [float(t.sum())] * 4

    assert stored(store) == [ref.oid]  # written once
    cid = cluster_id(cluster.client())
    cached = [machine_root(cid, tmp) / CACHE_DIR / ref.oid for tmp in hosts.values()]
    if store.startswith("s3://"):
        assert int(records(cluster).record(ref.oid)["fetches"]) == 2  # one copy per host
        assert all(path.stat().st_size == ref.size for path in cached)
    else:
        assert int(records(cluster).record(ref.oid)["fetches"]) == 0  # read where it lies
        assert not any(path.exists() for path in cached)
    gpulayer.free(ref)


def test_a_large_object_round_trips(cluster, store):
    t = torch.randn(52_500_000)  # 210 MB
    ref = gpulayer.put(t)
    assert ref.size > t.nbytes
    back = gpulayer.get(ref)
    assert torch.equal(back, t)
    del back
    gpulayer.free(ref)
    assert stored(store) == []


def test_the_sweep_removes_orphans_and_keeps_what_is_held(cluster, store):
    backend = backend_for(store)
    orphan = "f" * 32
    with backend.writer(orphan) as f:  # a writer that died before recording its object
        f.write(b"never recorded")
    kept = gpulayer.put(torch.ones(1000))

    swept = lifetimes.sweep(cluster.client(), stores=[store], orphan_age=-60)  # everything counts as old
    assert swept.orphans == 1
    assert stored(store) == [kept.oid]
    assert torch.equal(gpulayer.get(kept), torch.ones(1000))
    gpulayer.free(kept)
