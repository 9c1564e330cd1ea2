"""What an acknowledgement means on a Sentinel group (``durability``, store/durability.py), on real processes: a
primary, a replica and three sentinels on free loopback ports, one worker, and this process as the client.

With "replicated" (the group's default) a ``delay`` or a ``submit_batch`` returns once the replica has what it
sent; with the replica frozen (SIGSTOP) it raises ``NotReplicated`` naming the jobs, which may be sent again with
the same ids, and with "local" it returns; the worker logs a result and ack no replica confirmed, and carries on.
The tests share one group and run in order (the last one freezes the replica)."""

from __future__ import annotations

import os
import signal

import pytest
import redis

from gpulayer import NotReplicated, submit, submit_batch
from gpulayer import app as app_mod
from gpulayer.config import load_settings
from gpulayer.lab.fleet import wait_until
from gpulayer.lab.sentinel_fleet import SentinelFleet
from gpulayer.models import GangPlacement
from gpulayer.session import connect
from gpulayer.store import durability, keys
from gpulayer.store.connection import connect_redis
from gpulayer.store.gangs import GangStore

from .fleets import need_redis

TIMEOUT = 0.5  # seconds a write waits for the replica, here (the default is 2)


def square(x):
    return x * x


@pytest.fixture(scope="module")
def group_fleet(tmp_path_factory):
    need_redis()
    fleet = SentinelFleet(tmp_path_factory.mktemp("durability"), secret="durability-secret", password="group-pw",
                          torch=False)
    fleet.start_redis()
    try:
        env = dict(os.environ, GPULAYER_DURABILITY_TIMEOUT=str(TIMEOUT))  # the worker's: replicated by default
        fleet.add_workers({"d1": dict(slots=2, env=env)})
        yield fleet
    finally:
        fleet.stop()


def use(fleet, mode: str | None = None) -> None:
    """Connect this process to the group with ``durability`` = ``mode`` (None: the broker's default)."""
    connect(load_settings(broker_url=fleet.url, secret=fleet.secret, durability=mode, durability_timeout=TIMEOUT))


@pytest.fixture
def group(group_fleet):
    use(group_fleet)
    return group_fleet


def replica_client(fleet) -> redis.Redis:
    primary = fleet.group.primary_port()
    return redis.Redis.from_url(fleet.group.server_url(next(p for p in fleet.group.server_ports if p != primary)))


def worker_log(fleet) -> str:
    return (fleet.workdir / "d1.log").read_text(errors="replace")


def test_a_submit_and_a_batch_are_on_the_replica_when_the_call_returns(group):
    assert app_mod.settings().durability_mode() == "replicated"  # a sentinel:// broker's default
    replica = replica_client(group)
    sent = keys.client_jobs(app_mod.client_identity())
    try:
        handles = []
        for i in range(20):
            handles.append(submit.delay(square, i))
            # The job's record went in the same script as its message: on the replica as soon as delay returns.
            assert replica.zscore(sent, handles[-1].id) is not None
        batch = submit_batch([submit.s(square, i) for i in range(250)], chunk_size=100)
        assert replica.scard(keys.batch(batch.id)) == 250  # every chunk's records, with its messages
        assert [h.get(timeout=60) for h in handles] == [i * i for i in range(20)]
        assert batch.get(timeout=60) == [i * i for i in range(250)]
        # The worker stored the results and acked the jobs through the replica's confirmation.
        last = handles[-1].id
        wait_until(lambda: replica.exists(f"celery-task-meta-{last}", keys.job_done(last)) == 2, 30,
                   "the last result on the replica")
    finally:
        replica.close()
    assert "no replica confirmed" not in worker_log(group)


def test_a_gang_reservation_waits_for_the_replica(group, caplog):
    client = connect_redis(group.url)
    store = GangStore(client, app_mod.write_durability())
    placement = GangPlacement(workers=(), addresses=(), reason="test")
    try:
        with caplog.at_level("WARNING", logger="gpulayer.store.durability"):
            assert store.reserve("durability-gang", 1, placement, 1) == ("ok", "", 0)
        assert "no replica confirmed" not in caplog.text
        replica = replica_client(group)
        assert replica.hget(keys.gang("durability-gang"), "reserved_attempt") == b"1"
        replica.close()
    finally:
        client.close()


def test_with_the_replica_frozen_a_client_is_told_and_a_worker_carries_on(group, caplog, monkeypatch):
    """SIGSTOP of the replica (its connection stays open and silent): no write can be confirmed."""
    group.group.wait_synced()
    primary = group.group.primary_port()
    frozen = next(p for p in group.group.server_ports if p != primary)
    os.kill(group.group.procs[frozen].pid, signal.SIGSTOP)
    try:
        # "replicated": the call waits TIMEOUT, then raises naming the job; the job is on the primary and runs.
        with pytest.raises(NotReplicated) as err:
            submit.delay(square, 6)
        (job_id,) = err.value.job_ids
        assert job_id in str(err.value) and "same job id is safe" in str(err.value)
        with pytest.raises(NotReplicated) as err:
            submit_batch([submit.s(square, i) for i in range(30)])
        assert len(err.value.job_ids) == 30

        # "local": no wait. Sending the job again with its id, as the error says, runs it at most once more,
        # and its result is the one stored.
        use(group, "local")
        again = submit.apply_async((square, 6), task_id=job_id)
        assert again.get(timeout=60) == 36
        assert submit.delay(square, 7).get(timeout=60) == 49

        # The worker's result and ack went unconfirmed: logged, and the jobs finished all the same.
        wait_until(lambda: "no replica confirmed" in worker_log(group), 30, "the worker to log the miss")
        assert "the script that stored" in worker_log(group)

        # A gang's reservation (the coordinator's): logged, carried on.
        monkeypatch.setattr(durability, "_paused_until", {})
        client = connect_redis(group.url)
        try:
            store = GangStore(client, durability.Durability(1, int(TIMEOUT * 1000)))
            with caplog.at_level("WARNING", logger="gpulayer.store.durability"):
                placement = GangPlacement(workers=(), addresses=(), reason="test")
                assert store.reserve("durability-gang", 2, placement, 1) == ("ok", "", 0)
            assert "the reservation of gang durability-gang reached the primary but no replica" in caplog.text
        finally:
            client.close()
    finally:
        os.kill(group.group.procs[frozen].pid, signal.SIGCONT)
    group.group.wait_synced()
