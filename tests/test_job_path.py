"""The job path with real workers: takes that bring several messages, the ones that wait on the worker, and how
they go back (engine/transport.py): to a gang that reserves the worker's slots, and when the worker stops or dies.
"""

from __future__ import annotations

import os
import signal
import time

import gpulayer
from gpulayer import Resources, distributed, queues, submit, submit_batch
from gpulayer.app import redis_client
from gpulayer.store import keys
from gpulayer.store.gangs import GangStore
from gpulayer.store.jobs import JobRecords
from gpulayer.store.registry import Registry
from gpulayer.lab.fleet import wait_until


# The extra messages wait on their worker for the whole test (by default they would go back after a second);
# torch=False here and below: these jobs use no torch, so the workers skip importing it.
HOLD = dict(env=dict(os.environ, GPULAYER_PREFETCH_HOLD="300"), torch=False)


def blocker(run: str, i: int) -> str:
    """Holds its slot until the test sets ``<run>:release:<i>``."""
    import time as _t

    r = gpulayer.app.redis_client()
    r.rpush(f"{run}:started", i)
    deadline = _t.monotonic() + 120
    while not r.exists(f"{run}:release:{i}") and _t.monotonic() < deadline:
        _t.sleep(0.02)
    return i


def quick(run: str, i: int) -> tuple[int, str]:
    me = gpulayer.current_worker().id
    gpulayer.app.redis_client().rpush(f"{run}:ran:{i}", me)
    return i, me


def gang_rank(run: str) -> None:
    import time as _t

    gpulayer.init_process_group("gloo")
    r = gpulayer.app.redis_client()
    r.set(f"{run}:gang-running", 1)
    deadline = _t.monotonic() + 120
    while not r.exists(f"{run}:gang-release") and _t.monotonic() < deadline:
        _t.sleep(0.02)


def prefetch_behind_blockers(fleet, client, run: str, worker: str, slots: int, n_quick: int):
    """Fill ``worker``'s slots with blockers and its buffer with ``n_quick`` quick jobs, all in one take."""
    pin = Resources(worker_ids=[worker])
    # The worker's main process (the taker) waits while the batch is published, so one take sees every
    # message: a take that woke on the first one would fill the slots and leave the rest in the queue.
    taker = fleet.workers[worker]
    taker.send_signal(signal.SIGSTOP)
    try:
        batch = submit_batch([submit.s(blocker, run, i) for i in range(slots)]
                             + [submit.s(quick, run, i) for i in range(n_quick)], resources=pin)
    finally:
        taker.send_signal(signal.SIGCONT)
    life = keys.life(worker, fleet.workers[worker].pid)
    wait_until(lambda: client.llen(f"{run}:started") == slots and client.hlen(keys.inflight(life)) == slots + n_quick,
               60, "the blockers to run and the quick jobs to wait on the worker, recorded")
    assert client.llen(queues.private(worker)) == 0  # all taken: the quick jobs wait on the worker
    return batch, life


def ran(client, run: str, n: int) -> list[list[str]]:
    return [[w.decode() for w in client.lrange(f"{run}:ran:{i}", 0, -1)] for i in range(n)]


def test_a_gang_that_reserves_a_worker_with_prefetched_jobs_gets_its_slot_and_the_jobs_run_once(fresh_fleet):
    fleet = fresh_fleet
    # p2 runs the coordinator while p1 is frozen; neither judges the other dead meanwhile, however slow the machine.
    patient = dict(os.environ, GPULAYER_PREFETCH_HOLD="300", GPULAYER_WORKER_DEAD_AFTER="120")
    fleet.add_workers({"p1": dict(slots=2, env=patient), "p2": dict(slots=1, env=patient)})
    fleet.connect()
    client = redis_client()
    run = f"prefetch-gang:{time.time()}"
    batch, life = prefetch_behind_blockers(fleet, client, run, "p1", slots=2, n_quick=3)
    # The one moment a gang can reserve slots on a worker whose buffer is full: the registry still shows the
    # slots free (a heartbeat from before its jobs started). Freeze p1 there, so the reservation lands first.
    os.kill(fleet.workers["p1"].pid, signal.SIGSTOP)
    try:
        registry = Registry(client)
        p1 = next(w for w in registry.snapshot() if w.id == "p1")
        registry.heartbeat(p1.model_copy(update={"busy": 0, "held": 0}))
        job = distributed(gang_rank, run, nodes=1, procs_per_node=1, resources=Resources(worker_ids=["p1"]))
        job.placement  # reserved: one of p1's slots
        assert GangStore(client).held() == {"p1": 1}
    finally:
        os.kill(fleet.workers["p1"].pid, signal.SIGCONT)
    # p1 learns of the gang and hands the quick jobs back, at the head of its queue, as they were taken.
    wait_until(lambda: client.llen(queues.private("p1")) == 3, 30, "the prefetched jobs to go back to their queue")
    assert client.hlen(keys.inflight(life)) == 2  # only the blockers are still p1's
    client.set(f"{run}:release:0", 1)  # a slot frees: it is the gang's (its rank waited for room)
    wait_until(lambda: client.exists(f"{run}:gang-running"), 120, "the gang's rank to run")
    assert ran(client, run, 3) == [[], [], []]  # p1's other slot still runs blocker 1: no quick job started
    client.set(f"{run}:release:1", 1)  # p1's free slot (beside the gang's) runs them now, one at a time
    assert batch.get(timeout=60) == [0, 1, (0, "p1"), (1, "p1"), (2, "p1")]
    client.set(f"{run}:gang-release", 1)
    job.get(timeout=60)
    assert ran(client, run, 3) == [["p1"], ["p1"], ["p1"]]  # each once
    for job_id in batch.ids[2:]:  # given back as taken: no lost delivery, no redelivery
        assert JobRecords(client).history(job_id) == []
    wait_until(lambda: client.hlen(keys.inflight(life)) == 0, 10, "p1's records to go with its acks")
    client.close()


def test_a_stopping_worker_gives_back_what_it_prefetched_and_its_next_life_runs_it_once(fresh_fleet):
    fleet = fresh_fleet
    fleet.add_workers({"s1": dict(slots=1, **HOLD)})
    fleet.connect()
    client = redis_client()
    run = f"prefetch-stop:{time.time()}"
    batch, life = prefetch_behind_blockers(fleet, client, run, "s1", slots=1, n_quick=3)
    proc = fleet.workers.pop("s1")
    proc.send_signal(signal.SIGTERM)  # a warm shutdown: the running job finishes, the waiting ones go back
    client.set(f"{run}:release:0", 1)
    proc.wait(60)
    assert client.llen(queues.private("s1")) == 3
    assert ran(client, run, 3) == [[], [], []]
    fleet.add_worker("s1", slots=1, torch=False)
    assert batch.get(timeout=60) == [0, (0, "s1"), (1, "s1"), (2, "s1")]
    assert ran(client, run, 3) == [["s1"], ["s1"], ["s1"]]  # each once
    for job_id in batch.ids[1:]:  # given back as taken: no lost delivery, no redelivery
        assert JobRecords(client).history(job_id) == []
    client.close()


def test_a_killed_worker_s_prefetched_jobs_are_handed_back_and_each_runs_once(fresh_fleet):
    fleet = fresh_fleet
    fleet.add_workers({"k1": dict(slots=1, **HOLD), "k2": dict(slots=1, torch=False)})
    fleet.connect()
    client = redis_client()
    run = f"prefetch-kill:{time.time()}"
    batch, life = prefetch_behind_blockers(fleet, client, run, "k1", slots=1, n_quick=3)
    fleet.kill_worker("k1", signal.SIGKILL)
    fleet.workers.pop("k1")
    # k2's janitor hands back all four (recorded as k1's); pinned to k1, they wait for its next life. (A
    # restart would hand them back at once; waiting for the janitor shows nothing else is needed.)
    wait_until(lambda: client.llen(queues.private("k1")) == 4, 60, "the janitor to hand back k1's messages")
    client.set(f"{run}:release:0", 1)
    fleet.add_worker("k1", slots=1, torch=False)
    assert batch.get(timeout=60) == [0, (0, "k1"), (1, "k1"), (2, "k1")]
    assert ran(client, run, 3) == [["k1"], ["k1"], ["k1"]]  # each once: never lost, never run twice
    assert client.hlen(keys.inflight(life)) == 0
    # A worker that dies holds its prefetched messages as delivered: each counts one lost delivery (of max_deliveries).
    assert all([h["event"] for h in JobRecords(client).history(i)][:1] == ["lost"] for i in batch.ids)
    client.close()


def test_prefetched_jobs_behind_a_long_job_go_back_after_prefetch_hold_and_an_idle_worker_runs_them(fresh_fleet):
    fleet = fresh_fleet
    hold = dict(env=dict(os.environ, GPULAYER_PREFETCH_HOLD="3"), torch=False)
    fleet.add_workers({"h1": dict(slots=1, **hold), "h2": dict(slots=1, torch=False)})
    fleet.connect()
    client = redis_client()
    run = f"prefetch-hold:{time.time()}"
    life = keys.life("h1", fleet.workers["h1"].pid)
    os.kill(fleet.workers["h2"].pid, signal.SIGSTOP)  # h1 takes the whole batch
    try:
        # h1 waits too while the batch is published, so its one take sees every message (a take that its 1 s
        # poll started between two of them would fill its slot and leave the rest in the queue).
        os.kill(fleet.workers["h1"].pid, signal.SIGSTOP)
        try:
            batch = submit_batch([submit.s(blocker, run, 0)] + [submit.s(quick, run, i) for i in range(3)])
        finally:
            os.kill(fleet.workers["h1"].pid, signal.SIGCONT)
        wait_until(lambda: client.hlen(keys.inflight(life)) == 4, 30, "h1 to take the whole batch")
    finally:
        os.kill(fleet.workers["h2"].pid, signal.SIGCONT)
    # h1's slot stays busy: after prefetch_hold the quick jobs go back to the queue, and h2 (idle) runs them.
    wait_until(lambda: ran(client, run, 3) == [["h2"], ["h2"], ["h2"]], 60, "h2 to run the quick jobs")
    assert client.hlen(keys.inflight(life)) == 1  # meanwhile h1 holds only the blocker, still running
    client.set(f"{run}:release:0", 1)
    assert batch.get(timeout=60) == [0, (0, "h2"), (1, "h2"), (2, "h2")]
    for job_id in batch.ids[1:]:  # given back as taken
        assert JobRecords(client).history(job_id) == []
    client.close()


def test_a_job_sent_after_a_cancel_does_not_wait_behind_the_revoked_messages(fresh_fleet):
    """Celery acks a message it drops as revoked on the event loop's next turn, which used to come only after a
    poll of up to a second: a worker went through a cancelled batch's queued messages two a second (its prefetch
    count), and a job sent after the cancel waited behind them all (engine/transport.py, _turn_soon_if_acks_wait)."""
    fleet = fresh_fleet
    fleet.add_workers({"r1": dict(slots=2, torch=False)})
    fleet.connect()
    client = redis_client()
    run = f"revoked-drain:{time.time()}"
    batch = submit_batch([submit.s(blocker, run, i) for i in range(400)])
    wait_until(lambda: client.llen(f"{run}:started") >= 2, 60, "two of the batch's jobs to start")
    assert batch.cancel() == 400  # the two running are killed; the 398 queued are dropped as the worker takes them
    after = submit.delay(quick, run, 0)
    assert after.get(timeout=30) == (0, "r1")  # 398 at two a second would be over three minutes
    assert client.llen(queues.DEFAULT) == 0  # every revoked one was taken and dropped before it
    client.close()


def test_after_a_run_of_tiny_jobs_a_worker_takes_the_base_batch_again(fresh_fleet):
    """Takes grow (to BURST_MAX times free slots x prefetch_multiplier) while full takes of tiny jobs start at
    once; once a take finds the queue dry, the next batch is taken at the base again, so a worker that just ran
    tiny jobs does not sit on long ones an idle worker could run."""
    fleet = fresh_fleet
    fleet.add_workers({"r1": dict(slots=1, **HOLD)})
    fleet.connect()
    client = redis_client()
    run = f"burst:{time.time()}"
    pin = Resources(worker_ids=["r1"])
    assert submit_batch([submit.s(quick, run, i) for i in range(600)], resources=pin).get(timeout=120) == \
        [(i, "r1") for i in range(600)]
    taker = fleet.workers["r1"]
    taker.send_signal(signal.SIGSTOP)
    try:  # one take sees them all: 1 free slot x prefetch_multiplier 4 (the burst would have taken 16)
        batch = submit_batch([submit.s(blocker, run, 10)] + [submit.s(quick, run, 10 + i) for i in range(10)],
                             resources=pin)
    finally:
        taker.send_signal(signal.SIGCONT)
    life = keys.life("r1", taker.pid)
    wait_until(lambda: client.llen(f"{run}:started") == 1 and client.hlen(keys.inflight(life)) == 4, 60,
               "the blocker to run with 3 quick jobs waiting on the worker")
    assert client.llen(queues.private("r1")) == 7
    client.rpush(f"{run}:release:10", 1)
    assert batch.get(timeout=60) == [10] + [(10 + i, "r1") for i in range(10)]
    client.close()


# -- pure units of the transport's cheaper job path ---------------------------------------------------------
def test_takes_double_while_full_takes_start_at_once_and_fall_back_when_they_do_not():
    from types import SimpleNamespace

    from gpulayer.engine.transport import BURST_DRAIN, BURST_MAX, Channel

    ch = SimpleNamespace(_burst=1, _taking_again=True, _buffered_since=time.monotonic())
    grown = []
    for _ in range(4):
        Channel._drained(ch)
        grown.append(ch._burst)
    assert grown == [2, 4, 4, 4] and BURST_MAX == 4
    ch._buffered_since = time.monotonic() - 1.5 * BURST_DRAIN  # in between: stays
    Channel._drained(ch)
    assert ch._burst == 4
    ch._buffered_since = time.monotonic() - 3 * BURST_DRAIN  # slow: the base again
    Channel._drained(ch)
    assert ch._burst == 1
    ch._taking_again, ch._buffered_since = False, time.monotonic()  # fast but the take was not full: no growth
    Channel._drained(ch)
    assert ch._burst == 1

    def size(free, ahead, burst, fair_on=False):
        gate = SimpleNamespace(free=lambda: free, ahead=lambda: ahead)
        return Channel._batch_size(SimpleNamespace(qos=SimpleNamespace(gate=gate), _burst=burst,
                                                   _fair=SimpleNamespace(on=fair_on)))
    assert size(2, 4, 4) == 32 and size(2, 4, 1) == 8
    assert size(2, 4, 4, fair_on=True) == 2  # fair share on: each take fills the free slots only (docs/FAIRSHARE.md)
    assert size(2, 1, 4) == 2 and size(2, 0, 4) == 2  # prefetch off, or a gang holds slots here: one per free slot
    assert size(0, 4, 1) == 4  # (a take while no slot is free: kombu asked anyway)


def test_a_taken_message_decodes_as_kombu_decodes_it():
    import datetime as dt
    import uuid as uuid_mod

    from kombu.utils.json import dumps, loads

    from gpulayer.engine.transport import loads_message

    plain = dumps({"body": "eyJ4IjogMX0=", "headers": {"id": "a", "eta": None, "stamps": {}, "n": [1, 2.5]},
                   "properties": {"delivery_tag": "t", "priority": 0}}).encode()
    tagged = dumps({"headers": {"eta": dt.datetime(2026, 12, 2, 10, tzinfo=dt.timezone.utc),
                                "id": uuid_mod.UUID(int=7)}, "properties": {"delivery_tag": "t"}}).encode()
    assert b"__type__" in tagged and b"__type__" not in plain
    for raw in (plain, tagged):
        assert loads_message(raw) == loads(raw)
    assert isinstance(loads_message(tagged)["headers"]["eta"], dt.datetime)


def test_the_loop_removes_a_writer_only_for_a_pipe_it_watches():
    """Celery's pool asks to remove the writer of every idle child's pipe on every loop turn; the loop leaves a
    pipe it does not watch alone (kombu's would unregister it from epoll again, and catch the error)."""
    from kombu.asynchronous import Hub

    from gpulayer.engine.loop import remove_writers_only_if_added

    hub = Hub()
    r, w = os.pipe()
    try:
        remove_writers_only_if_added(hub)
        remove_writers_only_if_added(hub)  # once per loop, however many connections register
        unregistered = []
        unregister = hub.poller.unregister
        hub.poller.unregister = lambda fd: (unregistered.append(fd), unregister(fd))
        hub.remove_writer(w)  # not watched: nothing to do
        assert unregistered == []
        hub.add_writer(w, lambda: None)
        assert w in hub.writers
        hub.remove_writer(w)
        assert w not in hub.writers and unregistered == [w]
        hub.add_reader(r, lambda: None)
        hub.add_writer(w, lambda: None)
        hub.remove_writer(w)
        assert r in hub.readers and w not in hub.writers
    finally:
        hub.close()
        os.close(r)
        os.close(w)
