"""Workers on "separate machines": one network namespace each, on a veth bridge, Redis on the bridge."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid

import pytest

import gpulayer
from gpulayer import Resources, submit
from gpulayer.netns import NetnsLab, NetnsUnavailable
from gpulayer.testing import Fleet

pytestmark = pytest.mark.netns

WORKERS = {
    "ns-1": dict(zone="zone-a", region="region-1"),
    "ns-2": dict(zone="zone-b", region="region-1"),
}


def start_lab(count: int) -> NetnsLab:
    """A started lab, or a skip with the reason (a failure under CI)."""
    try:
        return NetnsLab(count).start()
    except NetnsUnavailable as err:
        if os.environ.get("CI"):
            pytest.fail(f"{err} (required under CI)")
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def netns_fleet(tmp_path_factory):
    lab = start_lab(len(WORKERS))
    try:
        fleet = Fleet(tmp_path_factory.mktemp("netns-fleet"), bind=f"127.0.0.1 {lab.host_address}",
                      host=lab.host_address)
        with fleet:
            for i, (name, spec) in enumerate(WORKERS.items(), start=1):
                fleet.add_worker(name, slots=2, prefix=lab.prefix(i), advertise_addr=lab.address(i), wait=False,
                                 **spec)
            fleet.wait_workers(list(WORKERS))
            fleet.connect()
            yield lab, fleet
    finally:
        lab.close()


def on(worker: str) -> dict:
    return {"resources": Resources(worker_ids=[worker])}


def local_addresses() -> dict:
    """This process's IPv4 addresses (from its namespace's routing table) and its namespace's id."""
    addrs, last = set(), None
    with open("/proc/net/fib_trie") as f:
        for line in f:
            if "|--" in line:
                last = line.split()[-1]
            elif "/32 host LOCAL" in line and last:
                addrs.add(last)
    return {"addresses": sorted(addrs), "netns": os.readlink("/proc/self/ns/net")}


def listen_once(host: str, key: str) -> bytes:
    """Accept one connection on ``host`` (any free port, published at ``key``) and return what it sent."""
    with socket.create_server((host, 0)) as srv:
        srv.settimeout(30)
        gpulayer.app.redis_client().rpush(key, srv.getsockname()[1])
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(10)
            return conn.recv(64)


def send(host: str, port: int, data: bytes) -> str:
    """Send ``data`` to ``host:port``; return the address the connection left from."""
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(data)
        return conn.getsockname()[0]


def test_each_worker_advertises_its_namespace_address(netns_fleet):
    lab, _ = netns_fleet
    seen = {w.id: w.address for w in gpulayer.app.registry().snapshot()}
    assert seen == {"ns-1": lab.address(1), "ns-2": lab.address(2)}


def test_a_pinned_job_runs_inside_its_workers_namespace(netns_fleet):
    lab, _ = netns_fleet
    here = local_addresses()
    for i, other in ((1, 2), (2, 1)):
        there = submit.delay(local_addresses, **on(f"ns-{i}")).get(timeout=30)
        assert lab.address(i) in there["addresses"]
        assert lab.address(other) not in there["addresses"]
        assert lab.host_address not in there["addresses"]
        assert there["netns"] != here["netns"]


def test_tcp_between_jobs_in_two_namespaces(netns_fleet):
    lab, fleet = netns_fleet
    key = f"test-netns:port:{uuid.uuid4().hex}"
    client = fleet.client()
    try:
        listener = submit.delay(listen_once, lab.address(2), key, **on("ns-2"))
        popped = client.blpop([key], timeout=30)
        assert popped is not None, "the listener job in ns-2 did not publish its port within 30s"
        port = int(popped[1])
        source = submit.delay(send, lab.address(2), port, b"hello", **on("ns-1")).get(timeout=30)
        assert listener.get(timeout=30) == b"hello"
        assert source == lab.address(1)
    finally:
        client.delete(key)
        client.close()


def test_the_lab_leaves_nothing_behind():
    """A lab of its own, closed twice: no namespace or link with its tag survives."""
    lab = start_lab(2)
    names = [lab.names.bridge] + [n for i in (1, 2) for n in (lab.namespace(i), lab.names.host_veth(i))]
    lab.close()
    lab.close()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    left += subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert not [n for n in names if n in left]


def allreduce_across_machines():
    import torch
    import torch.distributed as dist

    gpulayer.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"sum": t.item(), "master": os.environ["MASTER_ADDR"], "me": local_addresses()["addresses"],
            "worker": os.environ["GPULAYER_WORKER_ID"]}


@pytest.mark.parametrize("launcher", ["direct", "torchrun"])
def test_gang_allreduce_across_namespaces(netns_fleet, launcher):
    lab, fleet = netns_fleet
    fleet.connect()
    job = gpulayer.distributed(allreduce_across_machines, nodes=2, procs_per_node=2, launcher=launcher)
    assert job.placement.addresses == (lab.address(1), lab.address(2)) or \
        job.placement.addresses == (lab.address(2), lab.address(1))
    assert job.placement.reason == "placed on 2 workers in region region-1"
    out = job.get(timeout=240)
    assert [r["sum"] for r in out] == [6.0] * 4
    # Rank 0's worker hosts the store at its own namespace address; ranks 2-3 reach it across the bridge.
    node0_addr = job.placement.addresses[0]
    assert {r["master"] for r in out} == {node0_addr}
    assert node0_addr in out[0]["me"] and node0_addr not in out[2]["me"]
    assert job.placement.addresses[1] in out[2]["me"]
