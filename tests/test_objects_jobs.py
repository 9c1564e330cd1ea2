"""Large values on the job path (issue 42): arguments and results over the inline limit travel through the object
store as refs, never through Redis; put refs are written once and read by every job; forget() and free() delete
the objects; a failure to store names the size and the fix. A real Redis and real worker processes."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import torch
from celery import chain, chord, group

import gpulayer
from gpulayer import JobFailed, ObjectRef, ObjectStoreFull, PayloadError, Resources, submit, submit_batch
from gpulayer.lab.fleet import wait_until
from gpulayer.store import keys
from gpulayer.store.objects import ObjectRecords
from gpulayer.tasks import refs
from tests.fleets import running_fleet

MiB = 2**20
WORKERS = {"o-a": dict(slots=2), "o-b": dict(slots=2)}


# -- what the jobs run -----------------------------------------------------------------------------------------

def filled(n: int, value: float):
    return torch.full((n,), value)


def described(t):
    return t.numel(), float(t[0]), float(t[-1])


def digest(t, pause: float = 0.0):
    time.sleep(pause)
    return gpulayer.current_worker().id, hashlib.sha256(memoryview(t.numpy())).hexdigest()


def total(ts):
    return [float(t.sum()) for t in ts]


def plus(t, u):
    return float(t.sum() + u.sum())


# -- the fleet and its measures --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def module_fleet(tmp_path_factory):
    """Redis of its own (its memory is measured) and two workers of two slots."""
    with running_fleet(tmp_path_factory.mktemp("objects-fleet"), WORKERS) as f:
        yield f


@pytest.fixture
def fleet(module_fleet):
    module_fleet.connect()
    return module_fleet


def _records(fleet) -> ObjectRecords:
    return ObjectRecords(fleet.client())


def _store_dir(fleet) -> Path:
    url = gpulayer.objects.store_url(fleet.client())
    return Path(urlsplit(url).path)


def _files(fleet) -> set[str]:
    d = _store_dir(fleet)
    return {p.name for p in d.rglob("*") if p.is_file()} if d.exists() else set()


@contextmanager
def redis_growth(fleet):
    """``grown["bytes"]``: how far Redis's used_memory rose above where it was, sampled every few milliseconds
    (and its peak, where the run set a new one)."""
    client = fleet.client()
    memory = client.info("memory")
    base, peak = memory["used_memory"], memory["used_memory_peak"]
    top = [base]
    stop = threading.Event()

    def sample():
        c = fleet.client()
        while not stop.wait(0.005):
            top[0] = max(top[0], c.info("memory")["used_memory"])

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    grown: dict = {}
    try:
        yield grown
    finally:
        stop.set()
        watcher.join()
        after = client.info("memory")["used_memory_peak"]
        grown["bytes"] = max(top[0], after if after > peak else base) - base


def _log_sizes(fleet) -> dict[str, int]:
    return {name: (fleet.workdir / f"{name}.log").stat().st_size for name in WORKERS}


def _heartbeats_missed(fleet, since: dict[str, int]) -> list[str]:
    """Lines the workers logged after ``since`` (``_log_sizes``) saying a heartbeat was missed or a worker judged
    dead (a loaded machine may starve a worker while it starts: not this test's to judge)."""
    out = []
    for name in WORKERS:
        with open(fleet.workdir / f"{name}.log", "rb") as f:
            f.seek(since[name])
            text = f.read().decode(errors="replace")
        out += [line for line in text.splitlines() if "heartbeats are missing" in line or " is dead" in line]
    return out


# -- without Redis ---------------------------------------------------------------------------------------------

def test_a_tiny_jobs_arguments_are_plain_by_their_type():
    assert refs.plain_call((1, 2.0, "abc", None, b"x"), {"k": True})
    assert not refs.plain_call((1, [1, 2]), {})
    assert not refs.plain_call((), {"t": torch.zeros(2)})
    assert not refs.plain_call(("x" * 10_000,), {})


def test_refs_are_swapped_inside_containers_and_the_rest_is_kept():
    a, b = ObjectRef("a" * 32, 10, "file:///x", True), ObjectRef("b" * 32, 10, "file:///x")
    kept = [1, 2]
    value = {"a": a, "list": [b, (a,)], "kept": kept}
    out = refs.swap_refs(value, lambda r: r.oid[0])
    assert out == {"a": "a", "list": ["b", ("a",)], "kept": [1, 2]}
    assert out["kept"] is kept and value["a"] is a
    assert refs.swap_refs(kept, str) is kept


# -- the must-shows --------------------------------------------------------------------------------------

def test_a_300mb_argument_and_a_300mb_result_leave_redis_small(fleet):
    n = 75_000_000  # float32: 300 MB
    x = torch.full((n,), 3.0)
    logged = _log_sizes(fleet)
    with redis_growth(fleet) as grown:
        assert submit.delay(described, x).get(timeout=600) == (n, 3.0, 3.0)
        y = submit.delay(filled, n, 2.0).get(timeout=600)
    assert y.shape == (n,) and float(y[0]) == 2.0 and float(y[n // 2]) == 2.0 and float(y[-1]) == 2.0
    assert grown["bytes"] < 5 * MiB, f"Redis grew by {grown['bytes'] / MiB:.1f} MiB"
    assert _heartbeats_missed(fleet, logged) == []


def test_a_put_ref_passed_to_8_jobs_on_2_workers_is_written_once(fleet):
    t = torch.randn(50_000_000)  # 200 MB
    want = hashlib.sha256(memoryview(t.numpy())).hexdigest()
    records = _records(fleet)
    count, _ = records.stats()
    files = _files(fleet)
    ref = gpulayer.put(t)
    assert records.stats()[0] == count + 1 and len(_files(fleet) - files) == 1
    got = [h.get(timeout=600) for h in [submit.delay(digest, ref, 0.5) for _ in range(8)]]
    assert {d for _, d in got} == {want}  # every job saw the same values
    assert {w for w, _ in got} == set(WORKERS)
    assert records.stats()[0] == count + 1 and len(_files(fleet) - files) == 1  # never written again
    gpulayer.free(ref)
    assert records.record(ref.oid) is None and _files(fleet) == files


def test_forget_deletes_a_large_result_and_free_waits_for_the_jobs_that_hold_a_ref(fleet):
    h = submit.delay(filled, 2_000_000, 1.0)  # 8 MB
    value = h.get(timeout=120)
    stored = h.backend.get_task_meta(h.id)["result"]
    assert type(stored) is ObjectRef and stored.auto and stored.size >= 8_000_000
    records = _records(fleet)
    assert records.holders(stored.oid).keys() == {f"res:{h.id}"}
    h.forget()
    assert records.record(stored.oid) is None and stored.oid not in {f[:32] for f in _files(fleet)}
    assert float(value.sum()) == 2_000_000.0  # the caller's value outlives the object (a mapping of its file)

    ref = gpulayer.put(torch.ones(1_000_000))
    running = submit.delay(digest, ref, 3.0)
    assert gpulayer.free(ref) == 0  # the job holds it: nothing deleted yet
    assert records.holders(ref.oid).keys() == {f"arg:{running.id}"}
    assert running.get(timeout=120)[1] == hashlib.sha256(memoryview(torch.ones(1_000_000).numpy())).hexdigest()
    wait_until(lambda: records.record(ref.oid) is None, 30, "the freed object to go once its job ended")


def put_inside(n: int):
    return gpulayer.put(torch.full((n,), 4.0))


def test_a_job_that_returns_a_put_ref_gives_its_caller_the_ref_held_by_the_result(fleet):
    records = _records(fleet)
    h = submit.delay(put_inside, 1000)
    ref = h.get(timeout=120)
    assert type(ref) is ObjectRef and not ref.auto and float(ref.get()[999]) == 4.0
    # the job's own hold went with its process's ref; the stored result's stays until forget()
    wait_until(lambda: records.holders(ref.oid).keys() == {f"res:{h.id}"}, 30, "the result alone to hold the ref")
    h.forget()
    assert records.record(ref.oid) is None


def test_submit_batch_with_refs_and_large_arguments(fleet):
    records = _records(fleet)
    count, _ = records.stats()
    ref = gpulayer.put(torch.ones(5_000_000))  # 20 MB, shared by every job
    # two jobs of three also take a 2 MB argument of their own (an auto ref each)
    batch = submit_batch([submit.s(plus, ref, ref) if i % 3 == 0 else submit.s(plus, ref, torch.full((500_000,), i))
                          for i in range(9)])
    assert batch.get(timeout=300, progress=False) == [1e7 if i % 3 == 0 else 5e6 + 5e5 * i for i in range(9)]
    # each job's own argument is deleted once it ended; the put ref stays while its ref lives here
    wait_until(lambda: records.stats()[0] == count + 1, 30, "the batch's own arguments to be deleted")
    client = fleet.client()
    wait_until(lambda: not client.exists(*(keys.job_objects(i) for i in batch.ids)), 30,
               "the jobs' indexes of what they held to go")
    gpulayer.free(ref)
    assert records.stats()[0] == count


def test_a_chain_passes_a_ref_and_a_chord_gathers_refs(fleet):
    n = 7_500_000  # 30 MB
    with redis_growth(fleet) as grown:
        assert chain(submit.s(filled, n, 1.5), submit.s(described)).apply_async().get(timeout=300) == (n, 1.5, 1.5)
        # a later step's own large argument leaves the first step's message too
        assert chain(submit.s(filled, 10, 1.0), submit.s(plus, torch.ones(n))).apply_async().get(timeout=300) == n + 10
    assert grown["bytes"] < 5 * MiB, f"Redis grew by {grown['bytes'] / MiB:.1f} MiB"
    body = chord([submit.s(filled, 500_000, float(i)) for i in range(3)])(submit.s(total))
    assert body.get(timeout=300) == [0.0, 500_000.0, 1_000_000.0]
    assert [float(t[0]) for t in group(submit.s(filled, 500_000, float(i)) for i in range(2)).apply_async().get(
        timeout=300)] == [0.0, 1.0]
    big = torch.ones(500_000)  # 2 MB: an auto ref for each job that takes it
    assert group(submit.s(described, big) for _ in range(2)).apply_async().get(timeout=300) == [(500_000, 1.0, 1.0)] * 2
    assert submit.map(described, [big, big]).apply_async().get(timeout=300) == [(500_000, 1.0, 1.0)] * 2


def test_a_retried_job_keeps_its_arguments_until_its_last_try(fleet, tmp_path):
    records = _records(fleet)
    count, _ = records.stats()
    h = submit.apply_async((flaky_sum, str(tmp_path / "tries"), torch.ones(1_000_000)), max_retries=2,
                           autoretry_for=(ConnectionError,))
    assert h.get(timeout=120) == 1_000_000.0
    assert h.attempts == 3
    wait_until(lambda: records.stats()[0] == count, 30, "the job's argument to be deleted after its last try")


def test_a_cancelled_job_lets_go_of_its_arguments(fleet):
    from gpulayer.cancel import held_by_workers

    records = _records(fleet)
    count, _ = records.stats()
    running = submit.delay(digest, torch.ones(1_000_000), 120.0)  # a 4 MB argument (an auto ref), a long job
    wait_until(lambda: held_by_workers([running.id]), 60, "the job to run")
    assert records.stats()[0] == count + 1
    running.cancel()
    wait_until(lambda: records.stats()[0] == count, 30, "the cancelled job's argument to be deleted")
    with pytest.raises(JobFailed):
        running.get(timeout=60)


def flaky_sum(path, t):
    n = int(open(path).read()) + 1 if os.path.exists(path) else 1
    open(path, "w").write(str(n))
    if n <= 2:
        raise ConnectionError(f"refused on try {n}")
    return float(t.sum())


# -- what cannot be stored -------------------------------------------------------------------------------------

def test_no_store_for_a_multi_host_cluster_refuses_a_large_argument_before_sending(fleet, monkeypatch):
    from gpulayer.objects import api
    from gpulayer.store.sent import was_sent

    monkeypatch.setattr(api, "_on_this_host", lambda url: False)  # the broker as another host's
    monkeypatch.setattr(api, "_stores", {})
    with pytest.raises(PayloadError, match=r"^argument 1 \(Tensor\[2097152\]:float32\): a 8.0 MiB value .*"
                                           r"set GPULAYER_OBJECT_STORE") as e:
        submit.apply_async((described, torch.zeros(2 * MiB)), task_id="never-sent-1")
    assert "s3://" in str(e.value)
    assert not was_sent(fleet.client(), "never-sent-1")
    assert submit.delay(described, torch.zeros(4)).get(timeout=60) == (4, 0.0, 0.0)  # small values still go


def test_a_full_store_refuses_an_argument_and_fails_a_result_naming_size_and_fix(fleet, monkeypatch):
    monkeypatch.setenv("GPULAYER_OBJECT_STORE_MAX_BYTES", "4MB")
    fleet.connect()
    try:
        with pytest.raises(ObjectStoreFull, match=r"^argument 1 \(Tensor\[2000000\]:float32\): a 7.6 MiB value does "
                                                  r"not fit .*"
                                                  r"GPULAYER_OBJECT_STORE_MAX_BYTES"):
            submit.delay(described, torch.zeros(2_000_000))
    finally:
        monkeypatch.delenv("GPULAYER_OBJECT_STORE_MAX_BYTES")
        fleet.connect()
    fleet.add_worker("o-small", slots=1, env=dict(os.environ, GPULAYER_OBJECT_STORE_MAX_BYTES="4MB"))
    try:
        h = submit.delay(filled, 2_000_000, 1.0, resources=Resources(worker_ids=["o-small"]))
        with pytest.raises(JobFailed, match=r"the job's result \(Tensor\[2000000\]:float32\): a 7.6 MiB value does "
                                            r"not fit .*"
                                            r"GPULAYER_OBJECT_STORE_MAX_BYTES"):
            h.get(timeout=120)
    finally:
        fleet.stop_worker("o-small")


# -- the sweep and the status ----------------------------------------------------------------------------------

def test_a_worker_sweeps_an_object_whose_holders_expired(fleet):
    client = fleet.client()
    ref = gpulayer.objects.write(b"x" * (2 * MiB), "put:gone-process", client, expires=time.time() - 1)
    records = ObjectRecords(client)
    assert records.record(ref.oid) is not None
    client.delete(keys.OBJECT_SWEEP_LOCK)  # the next sweep now, not at the end of this period
    wait_until(lambda: records.record(ref.oid) is None, 30, "a worker's sweep to delete the expired object")
    assert ref.oid not in {f[:32] for f in _files(fleet)}


def test_status_shows_the_stores_objects(fleet):
    from gpulayer import status

    ref = gpulayer.put(b"y" * (3 * MiB))
    try:
        report = status.collect()
        objects = report["objects"]
        assert objects["count"] >= 1 and objects["bytes"] >= 3 * MiB and objects["store"].startswith("file://")
        text = "".join(item.text() for item in status.renderables(report))
        assert f"objects: {objects['count']}, " in text and objects["store"] in text
    finally:
        gpulayer.free(ref)
