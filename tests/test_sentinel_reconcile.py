"""Reconciliation after a broker failover, on real processes: a Sentinel group (a primary, a replica, three
sentinels, down-after 1000 ms) on free loopback ports and two workers of 2 slots. Each test fails the primary
over and ends with nothing lost and no slot booked twice: the ranks' own marks (which worker ran them, from
when to when) show at most 2 ranks at a time on a worker, and the ledger is empty once every gang ended."""

from __future__ import annotations

import json
import operator
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from gpulayer import app as app_mod
from gpulayer import distributed, submit, submit_batch
from gpulayer.app import redis_client
from gpulayer.config import load_settings
from gpulayer.gang.audit import RECORD_LOST
from gpulayer.lab.fleet import wait_until
from gpulayer.lab.sentinel_fleet import SentinelFleet
from gpulayer.models import GangPlacement
from gpulayer.session import connect
from gpulayer.store import keys, reconcile
from gpulayer.store.connection import connect_redis
from gpulayer.store.gangs import GangStore

from .fleets import need_redis

SLOTS = 2


def ranked(marks: str, seconds: float, restarted_seconds: float | None = None):
    """A rank that leaves ``<gang>.<attempt>.<rank>.<worker>.<start>.<end>`` in ``marks`` when it ends, and
    ``...start`` while it runs: a later audit counts the ranks each worker ran at once."""
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    name = f"{os.environ['GPULAYER_GANG_ID']}.{attempt}.{os.environ['RANK']}.{os.environ['GPULAYER_WORKER_ID']}"
    start = time.time()
    running = Path(marks, f"{name}.{start:.3f}.running")

    def ended(*_):
        os.rename(running, Path(marks, f"{name}.{start:.3f}.{time.time():.3f}"))

    def stopped(*_):  # stopped by its agent (SIGTERM): its end counts too
        ended()
        os._exit(143)

    signal.signal(signal.SIGTERM, stopped)
    running.touch()
    time.sleep(seconds if attempt == 0 or restarted_seconds is None else restarted_seconds)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    ended()
    return int(os.environ["RANK"])


def counted_square(x, marks):
    Path(marks, f"{x}.{os.getpid()}.{os.urandom(4).hex()}").touch()
    return x * x


def most_ranks_at_once(marks: Path) -> dict[str, int]:
    """For each worker, the most ranks that ran on it at one time (a rank still running counts to now)."""
    edges: dict[str, list] = {}
    for p in marks.iterdir():
        _, _, _, worker, start, end = _fields(p.name)
        stop = time.time() if end == "running" else float(end)
        edges.setdefault(worker, []).extend([(float(start), 1), (stop, -1)])
    most = {}
    for worker, points in edges.items():
        now = top = 0
        for _, step in sorted(points, key=lambda e: (e[0], e[1])):
            now += step
            top = max(top, now)
        most[worker] = top
    return most


def _fields(name: str) -> tuple[str, ...]:
    gang, attempt, rank, rest = name.split(".", 3)
    # rest: <worker>.<start int>.<start frac>.<end int>.<end frac> or <worker>.<start int>.<start frac>.running
    parts = rest.split(".")
    if parts[-1] == "running":
        return gang, attempt, rank, ".".join(parts[:-3]), f"{parts[-3]}.{parts[-2]}", "running"
    return gang, attempt, rank, ".".join(parts[:-4]), f"{parts[-4]}.{parts[-3]}", f"{parts[-2]}.{parts[-1]}"


@pytest.fixture(scope="module")
def group_fleet(tmp_path_factory):
    need_redis()
    fleet = SentinelFleet(tmp_path_factory.mktemp("reconcile"), secret="reconcile-secret", password="rec-pw",
                          torch=False, down_after_ms=1000, failover_timeout_ms=4000)
    fleet.start_redis()
    try:
        fleet.add_workers({"r1": dict(slots=SLOTS), "r2": dict(slots=SLOTS)})
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture
def group(group_fleet):
    """The fleet with both servers up and in sync (the one a test failed over comes back as a replica)."""
    group_fleet.group.restart_after = 0
    group_fleet.group.tend()
    group_fleet.group.wait_synced()
    group_fleet.connect()
    group_fleet.wait_workers(["r1", "r2"], timeout=30)
    yield group_fleet
    store = GangStore(redis_client())
    wait_until(lambda: not store.held() and not store.waiting(), 60, "every slot free and no gang waiting")


def replica_port(group) -> int:
    primary = group.group.primary_port()
    return next(p for p in group.group.server_ports if p != primary)


def server(group, port: int) -> redis.Redis:
    return redis.Redis.from_url(group.group.server_url(port))


def wait_ranks(marks: Path, gang_id: str, n: int) -> None:
    wait_until(lambda: sum(p.name.startswith(gang_id) for p in marks.iterdir()) >= n, 60, f"{n} ranks of {gang_id}")


def test_a_reassertion_counts_the_nodes_it_runs_and_the_orders_it_has_not_taken(group):
    client = redis_client()
    epoch = reconcile.primary_epoch(client)

    def order(gang: str, attempt: int, node: int, procs: int) -> str:
        return json.dumps({"gang_id": gang, "attempt": attempt, "node_rank": node, "spec": {"procs_per_node": procs}})

    client.rpush(keys.agent_orders("ghost"), order("g1", 0, 1, 2), order("g2", 3, 0, 1))
    try:
        # 1 slot of a running node, 2 of g1's order; g2's order was taken already (its pop lost in a failover).
        assert reconcile.reassert(client, "ghost", epoch, 1, ["g0 0 0"], ["g0 0 0", "g2 3 0"]) == 3
        assert client.hget(keys.SLOTS_HELD, "ghost") == b"3"
        marks, claimed = reconcile.claims(client)
        assert marks["ghost"] == epoch and claimed["ghost"] == {"g0 0 0", "g1 0 1"}
        assert reconcile.late(client, epoch, ["ghost"]) == []
        assert reconcile.late(client, "a-newer-primary", ["ghost", "nobody"]) == ["ghost"]
        client.delete(keys.agent_orders("ghost"))
        assert reconcile.reassert(client, "ghost", epoch, 0, [], []) == 0
        assert client.hget(keys.SLOTS_HELD, "ghost") is None and reconcile.claims(client)[1]["ghost"] == set()
    finally:
        client.delete(keys.agent_orders("ghost"))
        client.hdel(keys.SLOTS_HELD, "ghost")
        reconcile.forget(client, "ghost")


def test_the_coordinator_waits_for_a_late_worker_says_so_then_places_on_the_others(group, tmp_path):
    """A live worker that re-asserted on an older primary and not on this one (as right after a switch): a gang
    waits, saying why, for up to RECONCILE_WAIT seconds, and is then placed on the workers that re-asserted."""
    client = redis_client()
    epoch = reconcile.primary_epoch(client)
    client.hset(keys.RECONCILED, "r1", "an-older-primary")
    client.hdel(keys.PRIMARY_SEEN, epoch)  # this primary is new as of now
    try:
        job = distributed(ranked, str(tmp_path), 0.1, nodes=1, procs_per_node=2, timeout=120)
        wait_until(lambda: "have not re-asserted their slots on the new primary yet (r1)" in job.status()["reason"],
                   30, "the waiting reason")
        assert job.get(timeout=60) == [0, 1]
        assert job.placement.workers == ("r2",)
    finally:
        client.hset(keys.RECONCILED, "r1", epoch)


def test_a_gang_and_a_batch_run_through_a_failover(group, tmp_path):
    """The primary SIGKILLed while a 2x1 gang runs and a batch flows: the gang keeps running (one attempt, no
    restart), every job of the batch has its right result, and no worker ran more ranks than it has slots."""
    marks, jobs = tmp_path / "ranks", tmp_path / "jobs"
    marks.mkdir(), jobs.mkdir()
    gang = distributed(ranked, str(marks), 6.0, nodes=2, procs_per_node=1, timeout=120)
    wait_ranks(marks, gang.id, 2)
    n = 300
    batch = submit_batch([submit.s(counted_square, i, str(jobs)) for i in range(n)])
    wait_until(lambda: len(list(jobs.iterdir())) >= 20, 60, "the batch to be under way")
    group.group.wait_synced()
    killed = group.kill_primary()
    assert batch.get(timeout=120) == [i * i for i in range(n)]
    assert set(Counter(int(p.name.split(".")[0]) for p in jobs.iterdir())) == set(range(n))
    assert gang.get(timeout=120) == [0, 1]
    assert GangStore(redis_client()).record(gang.id)["attempt"] == 0  # kept running: never restarted
    assert max(most_ranks_at_once(marks).values()) <= SLOTS
    assert group.group.primary_port() != killed


def test_a_gang_whose_reservation_was_lost_restarts_and_nothing_is_booked_twice(group, tmp_path):
    """The replica lacks the last writes of a 2x2 gang's reservation (its record says waiting, the ledger holds
    nothing) when the primary dies: on the new primary the coordinator would place it again beside its running
    ranks. The workers re-assert their slots first; the gang's ranks fail fast with the failover's reason and it
    restarts once (max_restarts=1); a gang waiting for slots is placed after it; never more ranks than slots."""
    marks = tmp_path / "ranks"
    marks.mkdir()
    first = distributed(ranked, str(marks), 30.0, 0.5, nodes=2, procs_per_node=2, max_restarts=1, timeout=120)
    wait_ranks(marks, first.id, 4)
    behind = distributed(ranked, str(marks), 0.5, nodes=2, procs_per_node=2, timeout=120)
    client = redis_client()
    wait_until(lambda: "waiting for" in GangStore(client).record(behind.id)["reason"], 30, "the second to wait")
    group.group.wait_synced()
    # The replica loses what the reservation wrote, as a replica that lagged would (a write of its own).
    replica = server(group, replica_port(group))
    replica.config_set("replica-read-only", "no")
    arrival = float(replica.hget(keys.gang(first.id), "arrival"))
    replica.hset(keys.gang(first.id), mapping={"state": "waiting", "attempt": 0, "reason": "waiting for the coordinator"})
    replica.hdel(keys.gang(first.id), "placement", "reserved_attempt")
    replica.zadd(keys.GANGS_WAITING, {first.id: arrival})
    replica.delete(keys.SLOTS_HELD)
    replica.close()
    group.kill_primary()
    assert first.get(timeout=120) == [0, 1, 2, 3]
    assert behind.get(timeout=120) == [0, 1, 2, 3]
    tried = first.attempts
    assert len(tried) == 2 and RECORD_LOST in tried[0]["failure"], tried
    assert max(most_ranks_at_once(marks).values()) <= SLOTS, most_ranks_at_once(marks)
    ran = Counter((name.split(".")[0], name.split(".")[1]) for name in (p.name for p in marks.iterdir()))
    assert ran == {(first.id, "0"): 4, (first.id, "1"): 4, (behind.id, "0"): 4}, ran


def test_a_client_that_connects_during_the_switch(group, tmp_path):
    """A script started while the primary is frozen (SIGSTOP) connects, submits and gets its result from the
    new primary; a job acknowledged before the freeze is not lost. The old primary thaws once the switch is made
    and comes back as the new primary's replica: the script's ``delay`` (durability "replicated") waits for it
    rather than raising ``NotReplicated``."""
    before = submit.delay(counted_square, 6, str(tmp_path))
    assert before.get(timeout=60) == 36
    group.group.wait_synced()
    frozen = group.kill_primary(signal.SIGSTOP)
    thawed = threading.Event()

    def thaw_after_the_switch():
        try:
            wait_until(lambda: group.group.primary_port() != frozen, 60, "the sentinels to name a new primary")
        finally:
            os.kill(group.group.procs[frozen].pid, signal.SIGCONT)
            thawed.set()

    thaw = threading.Thread(target=thaw_after_the_switch, daemon=True)
    thaw.start()
    try:
        script = ("import operator, gpulayer\n"
                  "gpulayer.init()\n"
                  "print(gpulayer.submit.delay(operator.mul, 6, 7).get(timeout=90))\n")
        env = dict(os.environ, GPULAYER_BROKER_URL=group.url, GPULAYER_SECRET=group.secret,
                   PYTHONPATH=os.pathsep.join(sys.path))
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[-1] == "42"
        assert group.group.primary_port() != frozen
    finally:
        thaw.join(timeout=70)
        if not thawed.is_set():
            os.kill(group.group.procs[frozen].pid, signal.SIGCONT)
    assert before.get(timeout=30) == 36  # its result is on the new primary too
    wait_until(lambda: role(group, frozen) == "slave", 60, "the sentinels to demote the thawed primary")


def test_a_call_right_after_a_switch_waits_for_a_replica_to_come_back(group):
    """The group's only replica was promoted, so the new primary has none until the old one is back (started
    again from its files 1.5 s later): with ``min_replicas = 1`` (a write needs a replica; by default it goes on
    degraded, tests/test_sentinel_degraded.py) a ``delay`` made meanwhile, whose ``WAIT`` gives up after 0.3 s,
    waits for that replica to catch up (a switch under ``durability.SWITCH_WAIT`` s ago) instead of raising
    ``NotReplicated``."""
    group.group.restart_after = None  # nothing starts the killed primary again until this test does
    killed = group.kill_primary()
    wait_until(lambda: group.group.primary_port() != killed, 30, "the sentinels to name a new primary")
    connect(load_settings(broker_url=group.url, secret=group.secret, durability_timeout=0.3, min_replicas=1))
    assert app_mod.settings().durability_mode() == "replicated"

    def restart():
        group.group.restart_after = 0
        group.group.tend()

    later = threading.Timer(1.5, restart)
    later.start()
    try:
        handle = submit.delay(operator.mul, 6, 7)  # NotReplicated here without the wait after a switch
        assert later.finished.is_set()  # it returned after the replica was back, not before
        assert handle.get(timeout=60) == 42
    finally:
        later.join()
    wait_until(lambda: role(group, killed) == "slave", 60, "the old primary to follow the new one")


def wait_reconciled(group) -> None:
    """Until both workers re-asserted their slots on the primary now."""
    client = redis_client()
    wait_until(lambda: not reconcile.late(client, reconcile.primary_epoch(client), ["r1", "r2"]) and
               len(client.hgetall(keys.RECONCILED)) == 2, 30, "both workers to re-assert on the new primary")


def role(group, port: int) -> str:
    try:
        with server(group, port) as client:
            return client.info("replication")["role"]
    except redis.ConnectionError:
        return "?"


def test_a_ledger_write_to_an_old_primary_back_as_a_replica_lands_on_the_primary(group):
    """The old primary, back as a replica, refuses a reservation with READONLY: it is sent again to the
    primary, which books the slots once; giving them back leaves the ledger empty."""
    group.group.wait_synced()
    killed = group.kill_primary()
    wait_until(lambda: group.group.primary_port() != killed, 30, "the sentinels to name a new primary")
    group.group.restart_after = 0
    wait_until(lambda: group.group.tend() or role(group, killed) == "slave", 60, "the old primary back as a replica")
    wait_until(lambda: role(group, killed) == "slave", 60, "the old primary to follow the new one")
    primary = group.group.primary_port()
    wait_reconciled(group)  # the workers' re-assertions come first: the ledger below is theirs plus this gang's
    client = connect_redis(group.url, single_connection_client=True)
    try:
        client.ping()
        client.connection.disconnect()
        client.connection.connect_to(("127.0.0.1", killed))  # a connection that still reaches the old primary
        store = GangStore(client)
        placement = GangPlacement(workers=("r1",), addresses=("127.0.0.1",), reason="test")
        assert store.reserve("readonly-gang", 0, placement, 1) == ("ok", "", 0)
        assert client.connection.port == primary
        assert store.reserve("readonly-gang", 0, placement, 1) == ("already", "", 0)  # booked once
        with server(group, primary) as direct:
            assert direct.hget(keys.SLOTS_HELD, "r1") == b"1"
        assert store.release("readonly-gang", 0, "r1", 1)
        assert not store.held()
    finally:
        client.close()
