"""Who holds an object, and when it goes: holders in Redis, deletes by the last one out, and the sweep, raced
against jobs that hold, read and release."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest
import torch

from gpulayer import objects
from gpulayer.errors import ObjectMissing
from gpulayer.objects import lifetimes
from gpulayer.objects.backends import backend_for
from gpulayer.store import keys
from gpulayer.store.objects import ObjectRecords


def files(store_dir) -> set[str]:
    return set(os.listdir(store_dir)) if store_dir.exists() else set()


def test_write_records_the_object_and_counts_it(client, store_dir):
    records = ObjectRecords(client)
    a = objects.write(torch.ones(100_000), "put:me", client)
    b = objects.write(b"x" * 300_000, "put:me", client)
    assert a.auto and a.store == store_dir.as_uri() and a.size == os.path.getsize(store_dir / a.oid)
    assert records.stats() == (2, a.size + b.size)
    rec = records.record(a.oid)
    assert rec["state"] == "live" and int(rec["size"]) == a.size and rec["store"] == a.store
    assert set(records.holders(a.oid)) == {"put:me"}
    assert client.sismember(keys.OBJECTS, a.oid)
    assert torch.equal(objects.read(a), torch.ones(100_000)) and objects.read(b) == b"x" * 300_000
    assert lifetimes.release(client, [a, b], "put:me") == 2
    assert records.stats() == (0, 0) and files(store_dir) == set()
    assert not client.exists(keys.obj(a.oid), keys.obj_holders(a.oid)) and not client.smembers(keys.OBJECTS)


def test_an_arg_holder_keeps_the_object_past_its_put_holder(client, store_dir):
    ref = objects.write(torch.arange(50_000), "put:me", client, auto=False)
    lifetimes.hold(client, [ref], objects.arg_holder("job-1"), time.time() + 60)
    assert lifetimes.release(client, [ref], "put:me") == 0
    assert torch.equal(objects.read(ref), torch.arange(50_000))
    assert lifetimes.release(client, [ref], objects.arg_holder("job-1")) == 1
    assert files(store_dir) == set()
    with pytest.raises(ObjectMissing, match="gone from the object store"):
        objects.read(ref)
    with pytest.raises(ObjectMissing, match="put the value again"):
        lifetimes.hold(client, [ref], "arg:job-2", time.time() + 60)


def test_hold_is_all_or_none_and_refuses_an_object_being_deleted(client):
    records = ObjectRecords(client)
    a = objects.write(torch.ones(20_000), "put:me", client)
    b = objects.write(torch.ones(20_000), "put:me", client)
    assert records.release([(b.oid, "put:me")], time.time()) == [(b.oid, b.store)]  # deleter "died" here
    with pytest.raises(ObjectMissing, match=b.oid[:8]):
        lifetimes.hold(client, [a, b], "arg:j", time.time() + 60)
    assert set(records.holders(a.oid)) == {"put:me"}  # nothing added to a either
    lifetimes.hold(client, [a, a], "arg:j", time.time() + 60)  # twice in one call is fine
    lifetimes.hold(client, [a], "arg:j", time.time() + 5)  # an earlier expiry never shortens a hold
    assert records.holders(a.oid)["arg:j"] > time.time() + 30


def test_sweep_prunes_expired_holders_and_deletes_what_none_hold(client, store_dir):
    now = time.time()
    short = objects.write(torch.ones(20_000), "put:me", client, expires=now + 10)
    held = objects.write(torch.ones(20_000), "put:me", client, expires=now + 10)
    lifetimes.hold(client, [held], "res:job-1", now + 100)
    assert objects.sweep(client, now + 5).deleted == 0
    swept = objects.sweep(client, now + 20)
    assert swept.deleted == 1 and swept.objects == 2
    assert files(store_dir) == {held.oid}
    assert set(ObjectRecords(client).holders(held.oid)) == {"res:job-1"}  # the expired one pruned
    assert objects.sweep(client, now + 200).deleted == 1
    assert files(store_dir) == set() and ObjectRecords(client).stats() == (0, 0)
    with pytest.raises(ObjectMissing):
        objects.read(short)


def test_sweep_finishes_a_delete_whose_deleter_died(client, store_dir):
    ref = objects.write(torch.ones(20_000), "put:me", client)
    records = ObjectRecords(client)
    records.release([(ref.oid, "put:me")], time.time())  # marked deleting; its bytes never deleted
    assert objects.sweep(client).deleted == 0  # not yet stale: the deleter may be at work
    assert objects.sweep(client, time.time() + lifetimes.STALE_DELETING + 1).deleted == 1
    assert files(store_dir) == set() and records.stats() == (0, 0)


def test_sweep_removes_old_files_no_record_names(client, store_dir):
    kept = objects.write(torch.ones(20_000), "put:me", client)
    old = time.time() - 2 * lifetimes.ORPHAN_AGE
    orphan, recent, tmp = "a" * 32, "b" * 32, "c" * 32 + ".tmp-123-abcd"
    for name in (orphan, recent, tmp):
        (store_dir / name).write_bytes(b"left by a writer that died")
    for name in (orphan, tmp, kept.oid):
        os.utime(store_dir / name, (old, old))
    (store_dir / "not-ours.txt").write_text("someone else's")
    os.utime(store_dir / "not-ours.txt", (old, old))
    assert objects.sweep(client).orphans == 2
    assert files(store_dir) == {kept.oid, recent, "not-ours.txt"}
    assert torch.equal(objects.read(kept), torch.ones(20_000))


def test_sweepers_racing_jobs_never_delete_what_is_held(client, cluster, store_dir):
    """Jobs hold, read and release objects while sweepers (and the releases themselves) delete what nobody holds:
    every read of a held object succeeds, and at the end nothing unheld is left."""
    values = {}
    refs = []
    for i in range(40):
        t = torch.full((30_000,), float(i))
        # the put holders expire while the jobs run, so objects become unheld under the sweepers' feet
        refs.append(objects.write(t, "put:me", client, expires=time.time() + random.uniform(0.2, 3.0)))
        values[refs[-1].oid] = float(i)
    stop = threading.Event()
    errors: list = []
    reads = [0]
    refused = [0]

    def sweeper():
        c = cluster.client()
        try:
            while not stop.is_set():
                objects.sweep(c)
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)
        finally:
            c.close()

    def job(n: int):
        c = cluster.client()
        rng = random.Random(n)
        try:
            for k in range(150):
                mine = rng.sample(refs, 3)
                holder = objects.arg_holder(f"job-{n}-{k}")
                try:
                    lifetimes.hold(c, mine, holder, time.time() + 60)
                except ObjectMissing:
                    refused[0] += 1
                    continue
                for _ in range(2):  # held: every read must succeed, with the right values
                    for ref in mine:
                        got = objects.read(ref)
                        assert got[0].item() == values[ref.oid] and got.shape == (30_000,)
                        reads[0] += 1
                    time.sleep(rng.random() * 0.002)
                lifetimes.release(c, mine, holder)
        except Exception as err:
            errors.append(err)
        finally:
            c.close()

    threads = [threading.Thread(target=sweeper) for _ in range(2)] + [threading.Thread(target=job, args=(n,))
                                                                      for n in range(4)]
    for t in threads:
        t.start()
    for t in threads[2:]:
        t.join(300)
    stop.set()
    for t in threads[:2]:
        t.join(60)
    assert not errors, errors
    assert reads[0] > 0 and refused[0] > 0  # both sides of the race were reached
    objects.sweep(client, time.time() + 10)  # every put holder has expired by now
    assert files(store_dir) == set()
    assert ObjectRecords(client).stats() == (0, 0) and not client.smembers(keys.OBJECTS)
    assert not client.keys(keys.obj("*"))


def test_a_store_is_one_backend_per_url(store_dir):
    assert backend_for(str(store_dir)) is backend_for(store_dir.as_uri())
    assert backend_for(str(store_dir)).url == store_dir.as_uri()
