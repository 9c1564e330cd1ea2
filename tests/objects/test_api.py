"""``gpulayer.put / get / free`` against a real Redis and the local backend: lifetimes as the user sees them, and
values refused before a byte is written when they cannot fit."""

from __future__ import annotations

import gc
import os
import pickle
import re
import shutil
import time

import pytest
import torch

import gpulayer
from gpulayer import objects
from gpulayer.errors import ObjectMissing, ObjectStoreFull, PayloadError
from gpulayer.objects import api, lifetimes
from gpulayer.objects.backends import LocalDir
from gpulayer.store import keys
from gpulayer.store.objects import ObjectRecords
from gpulayer.lab.fleet import wait_until


def files(store_dir) -> set[str]:
    return set(os.listdir(store_dir)) if store_dir.exists() else set()


def test_put_get_free_round_trip(client, store_dir):
    t = torch.randn(1000, 300)
    ref = gpulayer.put(t)
    assert type(ref) is gpulayer.ObjectRef and not ref.auto
    assert repr(ref) == f"ObjectRef({ref.oid[:8]}..., {ref.summary.rsplit(' ', 2)[1]} MiB)"
    assert ref.summary.startswith("Tensor[1000, 300]:float32")
    assert torch.equal(gpulayer.get(ref), t) and torch.equal(ref.get(), t)
    assert gpulayer.get(5) == 5
    assert gpulayer.put(ref) is ref
    copy = pickle.loads(pickle.dumps(ref))
    assert copy == ref and len(pickle.dumps(ref)) < 400
    assert set(ObjectRecords(client).holders(ref.oid)) == {lifetimes.put_holder()}
    assert gpulayer.free(ref) == 1
    assert files(store_dir) == set() and ObjectRecords(client).stats() == (0, 0)
    with pytest.raises(ObjectMissing, match=f"object {ref.oid[:8]}.*gone"):
        gpulayer.get(copy)
    assert gpulayer.free(ref) == 0  # twice is fine


def test_free_leaves_the_object_to_the_jobs_that_hold_it(client, store_dir):
    ref = gpulayer.put(torch.ones(200_000))
    lifetimes.hold(client, [ref], objects.arg_holder("job-1"), time.time() + 60)
    assert gpulayer.free(ref) == 0
    assert torch.equal(objects.read(ref), torch.ones(200_000))  # the job still reads it
    assert lifetimes.release(client, [ref], objects.arg_holder("job-1")) == 1
    assert files(store_dir) == set()


def test_free_drops_a_stored_results_hold_too(client, store_dir):
    ref = objects.write(torch.ones(50_000), objects.res_holder("job-9"), client, auto=False)
    assert gpulayer.free(ref) == 1 and files(store_dir) == set()


def test_the_owning_ref_going_drops_its_hold_and_a_copy_owns_nothing(client, store_dir):
    ref = gpulayer.put(torch.ones(100_000))
    copy = pickle.loads(pickle.dumps(ref))
    oid = ref.oid
    del ref
    gc.collect()
    wait_until(lambda: not client.exists(keys.obj(oid)), 10, "the object to go with its owning ref")
    assert files(store_dir) == set()
    with pytest.raises(ObjectMissing):
        copy.get()
    kept = gpulayer.put(torch.ones(100_000))
    held = pickle.loads(pickle.dumps(kept))
    del held
    gc.collect()
    time.sleep(0.2)  # a copy's collection queues nothing; give the dropper a chance to misbehave
    assert client.exists(keys.obj(kept.oid)) and torch.equal(kept.get(), torch.ones(100_000))
    gpulayer.free(kept)


def test_stats_count_objects_and_bytes(client):
    refs = [gpulayer.put(torch.ones(n)) for n in (20_000, 40_000, 80_000)]
    records = ObjectRecords(client)
    assert records.stats() == (3, sum(r.size for r in refs))
    assert all(r.size > 4 * n for r, n in zip(refs, (20_000, 40_000, 80_000)))
    gpulayer.free(refs[1])
    assert records.stats() == (2, refs[0].size + refs[2].size)
    gpulayer.free(*refs)
    assert records.stats() == (0, 0)


def test_a_put_over_the_stores_limit_is_refused_before_writing(fresh_fleet, store_dir, monkeypatch):
    monkeypatch.setenv("GPULAYER_OBJECT_STORE", str(store_dir))
    monkeypatch.setenv("GPULAYER_OBJECT_STORE_MAX_BYTES", "1MB")
    fresh_fleet.connect()
    small = gpulayer.put(torch.ones(100_000))  # 400 kB: fits
    with pytest.raises(ObjectStoreFull) as err:
        gpulayer.put(torch.ones(200_000))  # 800 kB more: over 1 MB in all
    text = str(err.value)
    assert re.search(r"a 781\.\d KiB value does not fit in the object store file://.* it holds 390\.\d KiB of its "
                     r"976\.6 KiB limit", text), text
    assert "GPULAYER_OBJECT_STORE_MAX_BYTES" in text and "gpulayer.free" in text
    assert isinstance(err.value, PayloadError)
    assert files(store_dir) == {small.oid}  # nothing written for the refused one
    gpulayer.free(small)


def test_a_put_over_the_disks_free_space_is_refused_before_writing(client, store_dir, monkeypatch):
    monkeypatch.setattr(LocalDir, "free_bytes", lambda self: 500_000)
    with pytest.raises(ObjectStoreFull, match=r"a 3\.8 MiB value does not fit .* its disk has 488\.3 KiB free; "
                                              r".*GPULAYER_OBJECT_STORE"):
        gpulayer.put(torch.ones(1_000_000))
    assert files(store_dir) == set() and ObjectRecords(client).stats() == (0, 0)


def test_offload_keeps_small_values_and_stores_large_ones(client, store_dir, monkeypatch):
    assert objects.offload(5, "arg:j", client) == 5
    small = torch.ones(1000)
    assert objects.offload(small, "arg:j", client) is small
    unknown = [ValueError("small") for _ in range(3)]  # no cheap size: pickled to know, and small
    assert objects.offload(unknown, "arg:j", client) is unknown
    ref = objects.offload({"w": torch.ones(300_000)}, "arg:j", client)  # 1.2 MB, over the 1 MiB default
    assert type(ref) is objects.ObjectRef and ref.auto and files(store_dir) == {ref.oid}
    assert objects.offload(ref, "arg:j", client) is ref
    assert torch.equal(objects.read(ref)["w"], torch.ones(300_000))
    lifetimes.release(client, [ref], "arg:j")


def test_the_embedded_cluster_uses_one_directory_for_every_process(fresh_fleet, monkeypatch):
    monkeypatch.delenv("GPULAYER_OBJECT_STORE", raising=False)
    fresh_fleet.connect()
    client = fresh_fleet.client()
    try:
        from gpulayer.store.cluster import cluster_id, machine_root

        url = objects.store_url(client)
        assert url == (machine_root(cluster_id(client)) / "objects").as_uri()
        assert client.get(keys.OBJECTS_DEFAULT_STORE).decode() == url  # what the cluster's other processes read
        ref = gpulayer.put(torch.ones(100_000))
        assert ref.store == url and torch.equal(ref.get(), torch.ones(100_000))
        # The jobs' data, in a shared TMPDIR: the cluster root holding the store is this user's alone.
        assert machine_root(cluster_id(client)).stat().st_mode & 0o777 == 0o700
        gpulayer.free(ref)
    finally:
        shutil.rmtree(machine_root(cluster_id(client)), ignore_errors=True)
        client.close()


def test_no_store_on_a_cluster_beyond_this_host_is_refused_with_the_size_and_the_fix(client, monkeypatch):
    from gpulayer.config import Settings

    s = Settings(broker_url="redis://redis.internal:6379/0", secret="x")
    with pytest.raises(PayloadError, match="GPULAYER_OBJECT_STORE to s3://bucket/prefix"):
        api.store_url(object(), s)
    monkeypatch.setattr(api, "_settings", lambda: s)
    with pytest.raises(PayloadError, match=r"a 3\.8 MiB value \(over inline_limit_bytes, 1\.0 MiB\) cannot be "
                                           r"stored: no object store is configured and the cluster's broker is on "
                                           r"another host.*GPULAYER_OBJECT_STORE"):
        objects.offload(torch.ones(1_000_000), "arg:j", client)
    assert api._on_this_host("redis://:pw@127.0.0.1:6379/0") and api._on_this_host("redis://localhost:1/0")
    assert api._on_this_host("sentinel://127.0.0.1:26379,[::1]:26380/m")
    assert not api._on_this_host("sentinel://127.0.0.1:26379,10.0.0.2:26379/m")


def test_a_process_that_keeps_its_ref_renews_its_hold(client):
    ref = gpulayer.put(torch.ones(50_000))
    holder = lifetimes.put_holder()
    client.zadd(keys.obj_holders(ref.oid), {holder: time.time() + 5})  # as if put long ago
    api._renew()
    assert ObjectRecords(client).holders(ref.oid)[holder] > time.time() + 3600
    gpulayer.free(ref)


def test_a_ref_to_a_directory_this_host_lacks_says_the_store_must_be_shared(client, tmp_path):
    ref = objects.ObjectRef("d" * 32, 1000, (tmp_path / "elsewhere").as_uri(), True, "Tensor[10]:float32 1000 B")
    with pytest.raises(ObjectMissing, match="a directory this host does not have.*GPULAYER_OBJECT_STORE"):
        ref.get()


def _child_reads_and_drops(ref, out) -> None:
    value = ref.get()  # a pool process reads by the ref's store URL, with the secret it inherited
    out.put((tuple(value.shape), value[-1].item()))  # (no parallel torch op: a forked child may hang in one)
    del ref, value
    gc.collect()  # its copy of the parent's owning ref is collected here: that owns nothing in this process
    api._at_exit()  # nor does its exit


def test_a_forked_process_reads_the_object_and_owns_none_of_its_parents_holds(client):
    import multiprocessing

    ref = gpulayer.put(torch.ones(100_000))
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_reads_and_drops, args=(ref, out))
    child.start()
    assert out.get(timeout=60) == ((100_000,), 1.0)
    child.join(60)
    assert child.exitcode == 0
    time.sleep(0.2)
    assert set(ObjectRecords(client).holders(ref.oid)) == {lifetimes.put_holder()}
    assert gpulayer.free(ref) == 1


def test_a_store_path_that_cannot_be_a_directory_is_refused_naming_it_and_the_fix(cluster, tmp_path):
    from gpulayer.errors import ConfigError

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(ConfigError, match=r"a-file is a file, not a directory; give GPULAYER_OBJECT_STORE"):
        LocalDir(str(a_file)).put_file("0" * 32, a_file)
    # A typo in a shared file system's mount point is not made into a directory no other host sees.
    missing = tmp_path / "mnt-typo" / "objects"
    with pytest.raises(ConfigError, match=r"mnt-typo does not exist; create the store's directory"):
        LocalDir(str(missing)).put_file("0" * 32, a_file)
    assert not missing.parent.exists()
    made = LocalDir(str(tmp_path / "new"))
    made.put_file("0" * 32, a_file)
    assert (tmp_path / "new" / ("0" * 32)).is_file() and (tmp_path / "new").stat().st_mode & 0o777 == 0o700
    # A relative path would be each process's own directory: refused, naming the fix.
    for relative in ("objects", "file:objects"):
        with pytest.raises(ConfigError, match=r"is a relative path: .* give it absolute"):
            LocalDir(relative)
