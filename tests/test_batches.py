"""Several tiny jobs to a pool process in one exchange (engine/batches.py), with real workers: batches form under a
backlog, every job's result is its own and stored once, and a job that kills its process or is cancelled costs its
batch-mates a rerun, never a lost delivery or a result."""

from __future__ import annotations

import time

import pytest

import gpulayer
from gpulayer import JobFailed, Resources, submit, submit_batch
from gpulayer.app import redis_client
from gpulayer.store.jobs import JobRecords
from gpulayer.lab.fleet import wait_until

LIMIT = 3  # max_deliveries' default


def where(i: int):
    """Returns ``i`` and where it ran: ``(index, size)`` in a batch, or None alone."""
    from gpulayer.engine.batches import position

    return i, position()


def poison():
    import os as _os

    _os._exit(3)


def sleeper(run: str):
    import time as _t

    from gpulayer.engine.batches import position

    gpulayer.app.redis_client().rpush(f"{run}:started", repr(position()))
    _t.sleep(600)


def one_worker(fleet):
    fleet.add_workers({"b1": dict(slots=1, torch=False)})
    fleet.connect()
    return Resources(worker_ids=["b1"])


def events(client, job_id: str) -> list[str]:
    return [e["event"] for e in JobRecords(client).history(job_id)]


def test_tiny_jobs_under_a_backlog_share_pool_exchanges_and_each_gets_its_own_result(fresh_fleet):
    pin = one_worker(fresh_fleet)
    batch = submit_batch([submit.s(where, i) for i in range(600)], resources=pin)
    out = batch.get(timeout=120)
    assert [i for i, _ in out] == list(range(600))
    sizes = [p[1] for _, p in out if p is not None]
    assert sizes and max(sizes) > 1, "no batch formed under a backlog of 600 tiny jobs on one slot"
    # A batch's jobs are a run of consecutive messages, each at its own index.
    for i, p in ((i, p) for i, p in out if p is not None):
        assert 0 <= p[0] < p[1]
    client = redis_client()
    assert not any(events(client, j) for j in batch.ids[:50])  # nothing lost or run twice


def test_a_job_alone_gets_no_batch(fresh_fleet):
    pin = one_worker(fresh_fleet)
    assert [submit.delay(where, i, resources=pin).get(timeout=60) for i in range(5)] == [(i, None) for i in range(5)]


def test_a_job_that_kills_its_process_in_a_batch_costs_its_batch_mates_no_lost_delivery(fresh_fleet):
    pin = one_worker(fresh_fleet)
    batch = submit_batch([submit.s(where, i) for i in range(300)] + [submit.s(poison)]
                         + [submit.s(where, i) for i in range(300, 600)], resources=pin)
    out = batch.get(timeout=240, propagate=False)
    client = redis_client()
    ids = batch.ids
    poisoned = ids[300]
    assert isinstance(out[300], JobFailed)
    assert f"died on all {LIMIT} deliveries (limit {LIMIT})" in out[300].message
    assert [i for i, _ in out[:300] + out[301:]] == list(range(600))
    others = [j for j in ids if j != poisoned]
    # The poison job's own deaths are counted, and only them; its batch-mates went back uncounted and ran again.
    assert events(client, poisoned).count("lost") == LIMIT
    mates = [j for j in others if events(client, j)]
    assert mates, "the poison job never ran in a batch (no batch-mate was delivered again)"
    for j in mates:
        assert "lost" not in events(client, j), (j, events(client, j))
    assert JobRecords(client).losses(others[0]) == 0


def test_cancelling_a_batched_job_fails_only_it_and_its_batch_mates_run_again(fresh_fleet):
    pin = one_worker(fresh_fleet)
    run = f"cancel-batch:{time.time()}"
    batch = submit_batch([submit.s(where, i) for i in range(300)] + [submit.s(sleeper, run)]
                         + [submit.s(where, i) for i in range(300, 320)], resources=pin)
    client = redis_client()
    wait_until(lambda: client.llen(f"{run}:started") >= 1, 120, "the sleeper to start")
    started = client.lindex(f"{run}:started", 0).decode()
    slept = submit.AsyncResult(batch.ids[300])
    slept.cancel()
    with pytest.raises(JobFailed) as e:
        slept.get(timeout=60)
    assert "cancelled" in str(e.value), str(e.value)
    rest = [submit.AsyncResult(j).get(timeout=120) for j in batch.ids[:300] + batch.ids[301:]]
    assert [i for i, _ in rest] == list(range(320))
    assert started != "None", "the sleeper ran alone, not in a batch"
    index, size = (int(x) for x in started.strip("()").split(","))
    if index < size - 1:  # the jobs after it in its batch went back (uncounted) and ran again
        mates = batch.ids[301:301 + size - 1 - index]
        assert all("redelivered" in events(client, j) and "lost" not in events(client, j) for j in mates), started


def test_a_worker_takes_on_after_the_server_forgets_its_take_script(fresh_fleet):
    """The take goes by digest (EVALSHA): a server that no longer has the script (restarted, failed over,
    SCRIPT FLUSH) answers NOSCRIPT, and the worker sends the script whole, with the same results and acks."""
    pin = one_worker(fresh_fleet)
    client = redis_client()
    first = submit_batch([submit.s(where, i) for i in range(200)], resources=pin)
    client.script_flush()
    second = submit_batch([submit.s(where, i) for i in range(200, 400)], resources=pin)
    client.script_flush()
    third = [submit.delay(where, i, resources=pin) for i in range(400, 410)]
    assert [i for i, _ in first.get(timeout=60) + second.get(timeout=60)] == list(range(400))
    assert [h.get(timeout=60)[0] for h in third] == list(range(400, 410))
    assert not any(events(client, j) for j in first.ids + second.ids)  # nothing ran twice
    stats = client.info("commandstats")
    assert stats["cmdstat_evalsha"].get("failed_calls", 0) + stats["cmdstat_evalsha"].get("rejected_calls", 0) >= 1
    assert stats["cmdstat_eval"]["calls"] >= 1, stats.get("cmdstat_eval")  # the take, sent whole after NOSCRIPT


# -- pure units of the batcher --------------------------------------------------------------------------------
def test_a_group_forms_only_under_a_backlog_and_is_shared_between_free_slots():
    from gpulayer.engine.batches import Batches

    b = Batches()
    assert b.group_size(10, 2) == 0  # not installed in a worker: never
    b.apply, b.size = (lambda *a, **k: None), 8
    assert b.group_size(2, 2) == 0 and b.group_size(1, 1) == 0  # no backlog: each job alone
    assert b.group_size(10, 2) == 5 and b.group_size(40, 2) == 8 and b.group_size(3, 1) == 3


def test_batch_sizes_double_while_jobs_start_quickly_and_fall_back_on_a_slow_one():
    from gpulayer.engine.batches import BATCH_MAX, QUICK, SLOW, Batches, _Batch

    b = Batches()
    b.size = 2
    quick = [(True, (False, "ok", QUICK / 10))] * 2
    grown = []
    for _ in range(4):
        b._resize(_Batch([None] * b.size, True), quick[:1] * b.size)
        grown.append(b.size)
    assert grown == [4, 8, 8, 8] and BATCH_MAX == 8
    b._resize(_Batch([None] * 3, True), [(True, (False, "ok", SLOW * 2)), (True, (False, "ok", 0.0)), (True, (False, "ok", 0.0))])
    assert b.size == 1  # the third job started more than SLOW after the batch did


def test_a_finished_batch_stops_holding_its_slot_as_each_request_finishes_even_when_one_callback_fails():
    from gpulayer.engine.batches import Batches, _Batch

    b = Batches()
    seen = []
    reserved = {"a", "b", "c"}

    def finish(name, fail=False):
        def callback(value):
            # before the request finishes, the batch's slot is still counted (never less than 0 of it)
            assert len(reserved) - b.extra_reserved == 1, (name, reserved, b.extra_reserved)
            reserved.discard(name)
            # what the slot gate counts while the outcomes are handed out: the batch's requests, not its slot
            seen.append(len(reserved) - b.extra_reserved)
            if fail:
                raise RuntimeError("boom")
        return callback

    batch = _Batch([(None, (), {}, {"callback": finish(n, fail=(n == "b"))}) for n in "abc"], True)
    b.extra_reserved, b.full_in_flight, batch.accepted, b.extra_active = 2, 1, True, 2
    b._finish(batch, [(o["callback"], 1) for _, _, _, o in batch.applies])
    assert seen == [0, 0, 0], seen  # each finished request frees nothing more than its batch's slot
    assert (b.extra_reserved, b.extra_active, b.full_in_flight) == (0, 0, 0)


# -- a sweep you can work with (issue 40, item 4) -----------------------------------------------------------------
def square_or_raise(i: int, bad: int = 13):
    if i == bad:
        raise KeyError(f"shard {i}")
    return i * i


def square_after(i: int, run: str):
    """``i * i`` once ``run:go:<i>`` is set: the test decides the order the jobs finish in."""
    import time as _t

    r = gpulayer.app.redis_client()
    give_up = _t.monotonic() + 90  # a test that failed half-way leaves no job holding a slot for long
    while not r.exists(f"{run}:go:{i}") and _t.monotonic() < give_up:
        _t.sleep(0.01)
    return i * i


def test_twenty_jobs_one_raising_give_nineteen_values_and_the_exception_in_place(fleet):
    batch = submit_batch([submit.s(square_or_raise, i) for i in range(20)])
    assert len(batch) == 20 and batch[0].id == batch.ids[0] and batch[-1].id == batch.ids[19]
    assert [h.id for h in batch] == batch.ids and [h.id for h in batch[5:8]] == batch.ids[5:8]
    out = batch.get(timeout=60, propagate=False)
    assert [v for i, v in enumerate(out) if i != 13] == [i * i for i in range(20) if i != 13]
    err = out[13]
    assert isinstance(err, KeyError) and isinstance(err, JobFailed) and err.index == 13
    with pytest.raises(KeyError) as e:
        batch.get(timeout=60)
    assert e.value is err
    assert f"item 13 of 20: square_or_raise(13)" in str(e.value), str(e.value)
    assert batch.completed_count() == 19 and batch.finished_count() == 20  # Celery's: completed = succeeded
    assert batch.failed() and batch.ready() and not batch.successful() and not batch.waiting()
    assert [h.id for h in batch.failures()] == [batch.ids[13]]
    with pytest.raises(KeyError):
        batch[13].get(timeout=10)
    assert batch[12].get(timeout=10) == 144 and batch[5:8].get(timeout=10) == [25, 36, 49]


def test_as_completed_yields_every_job_as_it_finishes_and_wait_returns_done_and_pending(fleet):
    # one job that fails at once, then 3 that wait for the test (the session fleet has 5 slots)
    run = f"as-completed:{time.time()}"
    client = redis_client()
    batch = submit_batch([submit.s(square_or_raise, 13)] + [submit.s(square_after, i, run) for i in range(1, 4)])
    done, pending = batch.wait(1, timeout=0)
    assert done == [] or [h.id for h in done] == [batch.ids[0]]
    done, pending = batch.wait(1, timeout=30)  # failed jobs count as done
    assert [h.id for h in done] == [batch.ids[0]] and [h.id for h in pending] == batch.ids[1:]
    order = []
    seen = batch.as_completed(timeout=60)
    first = next(seen)
    assert first.id == batch.ids[0]
    with pytest.raises(KeyError):
        first.get(timeout=1)
    # The others as they finish (in what order is the workers': one may run a backlog of tiny jobs in one
    # exchange; the group below shows jobs that finish out of order).
    for i in (1, 2, 3):
        client.set(f"{run}:go:{i}", 1)
    for _ in range(3):
        h = next(seen)
        order.append(batch.ids.index(h.id))
        assert h.get(timeout=1) == order[-1] ** 2
    assert sorted(order) == [1, 2, 3]
    assert list(seen) == []  # all 4 given, each once
    done, pending = batch.wait(4, timeout=1)
    assert len(done) == 4 and pending == []
    with pytest.raises(ValueError):
        batch.wait(5)


def test_as_completed_gives_up_after_its_timeout_saying_what_waits(fleet):
    run = f"as-completed-timeout:{time.time()}"
    batch = submit_batch([submit.s(square_after, i, run) for i in range(2)])
    try:
        with pytest.raises(gpulayer.JobTimeout, match="0 of 2 jobs finished within 0.5 s"):
            list(batch.as_completed(timeout=0.5))
    finally:
        batch.cancel()


def test_a_groups_result_counts_yields_as_completed_and_names_a_failures_place(fleet):
    from gpulayer import group

    g = group(submit.s(square_or_raise, i, 2) for i in range(4)).apply_async()
    assert sorted(g.results.index(h) for h in g.as_completed(timeout=60)) == [0, 1, 2, 3]
    assert g.completed_count() == 3 and g.failed() and g.ready()
    with pytest.raises(KeyError) as e:
        g.get(timeout=60)
    assert isinstance(e.value, JobFailed) and "item 2 of 4" in str(e.value), str(e.value)
    values = g.get(timeout=60, propagate=False)
    assert values[:2] + values[3:] == [0, 1, 9] and isinstance(values[2], KeyError)
    done, pending = g.wait(4, timeout=10)
    assert len(done) == 4 and not pending
    run = f"group-order:{time.time()}"
    g = group(submit.s(square_after, i, run, resources=Resources(worker_ids=[w]))
              for i, w in ((0, "w-a"), (1, "w-b"))).apply_async()
    seen = g.as_completed(timeout=60)
    redis_client().set(f"{run}:go:1", 1)
    assert next(seen) is g.results[1]
    redis_client().set(f"{run}:go:0", 1)
    assert next(seen) is g.results[0] and list(seen) == []
    assert g.get(timeout=10) == [0, 1]
