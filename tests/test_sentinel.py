"""A Sentinel group as the broker, on real processes: a primary, a replica and three sentinels on free loopback
ports, two workers, and this process as the client. The group is killed into a failover here, so the tests of
this module share one fleet and run in order: jobs through the sentinels, a READONLY write sent again to the
primary, a manual failover, then the primary SIGKILLed mid-batch."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import warnings
from collections import Counter
from pathlib import Path

import pytest
import redis

from gpulayer import DurabilityDegraded, submit, submit_batch
from gpulayer.lab.fleet import wait_until
from gpulayer.errors import ConfigError
from gpulayer.lab.sentinel_fleet import SentinelFleet
from gpulayer.local import wait_for_port
from gpulayer.local.cluster import check_group_shape
from gpulayer.procs.env import free_port
from gpulayer.procs.stop import stop_process
from gpulayer.store.connection import connect_redis
from gpulayer.store import durability
from gpulayer.store.replication import replication

from .fleets import need_redis
from .test_tls import make_tls_files


def square(x):
    return x * x


def counted_square(x, marks):
    """``x * x`` after 20 ms, leaving a file per run in ``marks`` (a job run twice leaves two)."""
    time.sleep(0.02)
    Path(marks, f"{x}.{os.getpid()}.{os.urandom(4).hex()}").touch()
    return x * x


def runs(marks: Path) -> Counter:
    return Counter(int(p.name.split(".", 1)[0]) for p in marks.iterdir())


@pytest.fixture(scope="module")
def group_fleet(tmp_path_factory):
    need_redis()
    fleet = SentinelFleet(tmp_path_factory.mktemp("sentinel"), secret="sentinel-secret", password="group-pw",
                          torch=False)
    fleet.start_redis()
    try:
        fleet.add_workers({"s1": dict(slots=2), "s2": dict(slots=2)})
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture
def group(group_fleet):
    group_fleet.connect()
    return group_fleet


def test_jobs_run_through_the_sentinels(group):
    assert group.url.startswith("sentinel://:group-pw@127.0.0.1:")
    assert submit.delay(square, 7).get(timeout=60) == 49
    assert submit_batch([submit.s(square, i) for i in range(100)]).get(timeout=60) == [i * i for i in range(100)]
    # Everything went to the server the sentinels name as primary; the replica has it too.
    primary = redis.Redis.from_url(group.group.server_url(group.group.primary_port()))
    assert primary.info("replication")["role"] == "master" and primary.dbsize() > 0
    primary.close()


def test_flower_shows_the_workers_and_the_primarys_queues(group, tmp_path):
    """`gpulayer flower` on a Sentinel group: its events come through the sentinels, and its broker page and
    queue-length API read the primary; the group's password shows nowhere."""
    port = free_port()
    env = dict(os.environ, GPULAYER_BROKER_URL=group.url, GPULAYER_SECRET=group.secret, FLOWER_BASIC_AUTH=AUTH)
    with open(tmp_path / "flower.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gpulayer", "flower", "--port", str(port)], env=env,
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        assert wait_for_port(port, proc), (tmp_path / "flower.log").read_text()
        url = f"http://127.0.0.1:{port}/"
        workers = wait_until(lambda: {w.split("@")[0] for w in json.loads(get(url + "api/workers", AUTH))} >=
                             {"s1", "s2"}, 60, "Flower to list both workers")
        assert workers
        lengths = json.loads(get(url + "api/queues/length", AUTH))["active_queues"]
        assert "gl.q.cpu" in {q["name"] for q in lengths}
        for page in ("", "workers", "broker"):
            assert "group-pw" not in get(url + page, AUTH), page
    finally:
        stop_process(proc, grace=5)


def test_a_write_refused_by_a_replica_goes_to_the_primary(group):
    """A connection that reached a replica (a demoted primary) has its write refused with READONLY: the
    client asks the sentinels again and sends the write to the primary, instead of failing."""
    client = connect_redis(group.url, single_connection_client=True)
    try:
        client.ping()
        primary = group.group.primary_port()
        replica = next(p for p in group.group.server_ports if p != primary)
        client.connection.disconnect()
        client.connection.connect_to(("127.0.0.1", replica))  # as if the primary had been demoted under it
        assert client.connection.port == replica
        client.set("sentinel-test:readonly", "sent again")
        assert client.connection.port == primary
        with client.pipeline() as pipe:  # a pipeline too: refused whole, sent again whole
            client.connection.disconnect()
            client.connection.connect_to(("127.0.0.1", replica))
            pipe.incr("sentinel-test:pipe").incr("sentinel-test:pipe")
            assert pipe.execute() == [1, 2]
        direct = redis.Redis.from_url(group.group.server_url(primary))
        assert direct.get("sentinel-test:readonly") == b"sent again" and direct.get("sentinel-test:pipe") == b"2"
        direct.close()
    finally:
        client.close()


def replica_back(fleet) -> None:
    """Start again what a failover left dead, and wait until the primary has a replica in step. A group of a
    primary and one replica has no replica after a failover until then, and its "replicated" writes are not
    confirmed (docs/RELIABILITY.md, "Sentinel: what a failover does")."""
    fleet.group.restart_after = 0
    fleet.group.tend()

    def following() -> bool:
        try:
            with connect_redis(fleet.url) as client:
                return any(r["state"] == "online" for r in replication(client)["replicas"])
        except redis.RedisError:
            return False

    wait_until(following, 60, "a replica to follow the primary")
    fleet.group.wait_synced()


def role(group, port: int) -> str:
    client = redis.Redis.from_url(group.group.server_url(port))
    try:
        return client.info("replication")["role"]
    except redis.ConnectionError:  # cut off by the sentinels as they reconfigure it: ask again
        return "?"
    finally:
        client.close()


def test_a_manual_failover_is_followed_by_workers_and_clients(group):
    """SENTINEL FAILOVER: the replica becomes the primary and, once the sentinels demote it, the old primary a
    replica (its clients cut off); the workers follow without a restart."""
    before = group.group.primary_port()
    with group.group.sentinel_client() as s:
        s.execute_command("SENTINEL", "FAILOVER", group.group.service)
    after = wait_until(lambda: group.group.primary_port() != before and group.group.primary_port(), 30,
                       "the sentinels to name a new primary")
    # Until then the old primary still takes writes (Sentinel's split-brain window; docs/RELIABILITY.md, "Sentinel: what a failover does").
    wait_until(lambda: role(group, before) == "slave", 60, "the sentinels to demote the old primary")
    assert role(group, after) == "master"
    # The workers' heartbeats of the split-brain window went to the old primary and were lost with its data:
    # they show again on the new one once the workers reconnect (a client's registry lags meanwhile: issue 30).
    group.wait_workers(["s1", "s2"], timeout=30)
    replica_back(group)  # the demoted primary, once it has caught up
    assert submit.delay(square, 12).get(timeout=60) == 144
    assert submit_batch([submit.s(square, i) for i in range(50)]).get(timeout=60) == [i * i for i in range(50)]


def test_the_primary_killed_mid_batch_the_batch_completes(group, tmp_path):
    """SIGKILL of the primary while a batch runs: after the failover every job has its right result. A job
    whose ack was lost with the old primary may run again (at-least-once): counted, not hidden."""
    marks = tmp_path / "marks"
    marks.mkdir()
    n = 400
    group.group.wait_synced()  # a replica still catching up after the last test's failover could not take over
    handle = submit_batch([submit.s(counted_square, i, str(marks)) for i in range(n)])
    wait_until(lambda: len(list(marks.iterdir())) >= 40, 60, "the batch to be under way")
    # The batch's publish reached the replica too: without WAIT an acknowledged write can be lost in a failover
    # (docs/RELIABILITY.md, "Sentinel: what a failover does"), and what is tested here is that every connection finds the new primary.
    group.group.wait_synced()
    killed = group.kill_primary()
    done_before = len(list(marks.iterdir()))
    results = handle.get(timeout=120)
    assert results == [i * i for i in range(n)]
    ran = runs(marks)
    assert set(ran) == set(range(n))
    reruns = sum(c - 1 for c in ran.values())
    print(f"killed the primary on port {killed} after {done_before} of {n} jobs ran; all {n} right, {reruns} run "
          "again after a lost ack")
    assert done_before < n
    wait_until(lambda: group.group.primary_port() != killed, 30, "every sentinel to name the new primary")
    group.wait_workers(["s1", "s2"], timeout=30)  # their beats of the switch's seconds show (docs/RELIABILITY.md, "Sentinel: what a failover does")
    # The group's one replica is its primary now and the killed one stays down: no replica is in sync, so a submit
    # goes on acknowledged by the primary alone (durability degraded: issue 41; min_replicas = 1 refuses it with
    # NotReplicated, tests/test_sentinel_degraded.py); once a replica follows, it waits for it again.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DurabilityDegraded)
        assert submit.delay(square, 4).get(timeout=60) == 16
    assert durability.degraded()
    replica_back(group)
    assert submit.delay(square, 3).get(timeout=60) == 9  # and the fleet goes on



def test_a_frozen_primary_is_left_for_the_new_one_mid_batch(group, tmp_path):
    """SIGSTOP of the primary (a machine that hangs): its connections neither fail nor answer; once the
    sentinels promote the replica, every process cuts them and goes on with the new primary."""
    replica_back(group)  # the server the last test killed is back, as a replica in step
    marks = tmp_path / "marks"
    marks.mkdir()
    n = 300
    handle = submit_batch([submit.s(counted_square, i, str(marks)) for i in range(n)])
    wait_until(lambda: len(list(marks.iterdir())) >= 30, 60, "the batch to be under way")
    group.group.wait_synced()
    frozen = group.kill_primary(signal.SIGSTOP)
    try:
        assert handle.get(timeout=120) == [i * i for i in range(n)]
        assert set(runs(marks)) == set(range(n))
        # The heartbeats the frozen primary took are not on the new one: the workers show again on their next
        # beat (until then a client is told no worker is live: docs/RELIABILITY.md, "Sentinel: what a failover does"; reconciliation is issue 30's).
        group.wait_workers(["s1", "s2"], timeout=30)
    finally:
        os.kill(group.group.procs[frozen].pid, signal.SIGCONT)
    wait_until(lambda: role(group, frozen) == "slave", 60, "the sentinels to demote the thawed primary")
    replica_back(group)  # (until the thawed one follows, the new primary has no replica to confirm a submit)
    assert submit.delay(square, 5).get(timeout=60) == 25
    logs = "".join((group.workdir / f"{w}.log").read_text(errors="replace") for w in ("s1", "s2"))
    assert f"connection(s) to the old primary 127.0.0.1:{frozen}" in logs


AUTH = "ops:flower-login-pw"


def get(url: str, auth: str, timeout: float = 30) -> str:
    headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
        return r.read().decode()


def gpulayer_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "gpulayer", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


def test_up_runs_a_sentinel_group_and_status_follows_its_failover(gpulayer_home):
    """`gpulayer up --replicas 1 --sentinels 3`: the embedded cluster on a Sentinel group; `gpulayer status`
    names the primary and its replica, and after the primary is killed, the new primary."""
    need_redis()
    out = gpulayer_cli("up", "--workers", "1", "--slots", "1", "--replicas", "1", "--sentinels", "3")
    try:
        assert out.returncode == 0, out.stderr
        assert "started: broker sentinel://:***@127.0.0.1:" in out.stdout and "Sentinel group: redis-" in out.stdout
        # What losing the one replica means, in one line (issue 41).
        (lost,) = [line for line in out.stdout.splitlines() if line.startswith("one replica: ")]
        assert "writes go on acknowledged by the primary alone" in lost and "GPULAYER_MIN_REPLICAS=1" in lost
        state = json.loads((gpulayer_home / "cluster.json").read_text())
        pids = state["sentinel_group"]["pids"]
        assert len([n for n in pids if n.startswith("redis-")]) == 2 and len(pids) == 5
        status = gpulayer_cli("status")
        assert status.returncode == 0, status.stderr
        primary = status.stdout.split("Sentinel group 'gpulayer': primary ", 1)[1].split()[0]
        assert "  replica 127.0.0.1:" in status.stdout and "local-1" in status.stdout
        assert "durability replicated: a write is acknowledged once a replica has it" in status.stdout
        os.kill(pids[f"redis-{primary.rsplit(':', 1)[1]}"], signal.SIGKILL)

        def new_primary():
            s = gpulayer_cli("status")
            return s.returncode == 0 and f"primary {primary}" not in s.stdout and "Sentinel group" in s.stdout

        wait_until(new_primary, 60, "`gpulayer status` to name a new primary")
    finally:
        down = gpulayer_cli("down")
        assert down.returncode == 0, down.stderr


@pytest.mark.parametrize("replicas, sentinels, says", [(1, 0, "add --sentinels 3"), (0, 3, "add --replicas 1"),
                                                       (-1, 3, "cannot be negative")])
def test_half_a_sentinel_group_is_refused(replicas, sentinels, says):
    with pytest.raises(ConfigError, match=says):
        check_group_shape(replicas, sentinels)


def test_a_tls_group_with_client_certificates_fails_over_too(tmp_path):
    """sentinels://: the sentinels and the servers speak TLS only (with client certificates); jobs run, and
    run again after the primary is killed."""
    need_redis()
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command line to make a throwaway CA")
    tls = make_tls_files(tmp_path / "tls")
    fleet = SentinelFleet(tmp_path / "fleet", secret="tls-secret", password="tls-pw", torch=False)
    fleet.start_redis(tls=tls)
    try:
        assert fleet.url.startswith("sentinels://:tls-pw@127.0.0.1:") and "ssl_certfile=" in fleet.url
        fleet.add_workers({"t1": dict(slots=2)})
        fleet.connect()
        assert submit.delay(square, 8).get(timeout=60) == 64
        fleet.group.wait_synced()
        killed = fleet.kill_primary()
        wait_until(lambda: fleet.group.primary_port() != killed, 30, "the sentinels to name the new primary")
        fleet.wait_workers(["t1"], timeout=30)
        replica_back(fleet)
        assert submit_batch([submit.s(square, i) for i in range(40)]).get(timeout=90) == [i * i for i in range(40)]
    finally:
        fleet.stop()
