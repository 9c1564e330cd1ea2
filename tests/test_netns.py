"""Workers on "separate machines": one network namespace each, on a veth bridge, Redis on the bridge."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import uuid

import pytest

import gpulayer
from gpulayer import Resources, submit
from gpulayer.lab import netns
from gpulayer.lab.netns import NetnsLab, NetnsUnavailable, Shaping, Topology
from gpulayer.lab.fleet import Fleet, wait_until

pytestmark = pytest.mark.netns

WORKERS = {
    "ns-1": dict(zone="zone-a", region="region-1"),
    "ns-2": dict(zone="zone-b", region="region-1"),
}
# The module's fleet: one machine per worker above, in its zone, the link between the zones shaped.
FLEET_TOPOLOGY = Topology({"region-1": {"zone-a": 1, "zone-b": 1}})


def start_lab(topology: Topology | int, shaping: Shaping | None = None) -> NetnsLab:
    """A started lab, or a skip with the reason (a failure under CI)."""
    try:
        return NetnsLab(topology, shaping).start()
    except NetnsUnavailable as err:
        if os.environ.get("CI"):
            pytest.fail(f"{err} (required under CI)")
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def netns_fleet(tmp_path_factory):
    lab = start_lab(FLEET_TOPOLOGY, Shaping())
    try:
        fleet = Fleet(tmp_path_factory.mktemp("netns-fleet"), bind=f"127.0.0.1 {lab.host_address}",
                      host=lab.host_address)
        with fleet:
            for (name, spec), machine in zip(WORKERS.items(), lab.machines):
                assert (machine.zone, machine.region) == (spec["zone"], spec["region"])
                fleet.add_worker(name, slots=2, prefix=lab.prefix(machine.index), advertise_addr=machine.address,
                                 wait=False, **spec)
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
    assert not [lab.namespace(i) for i in (1, 2) if (netns.ETC_NETNS / lab.namespace(i)).exists()]


LOOKUPS = ("import socket,sys,json\n"
           "def rev(a):\n try: return socket.gethostbyaddr(a)[0]\n except OSError as e: return f'error {e.errno}'\n"
           "print(json.dumps({'peer': socket.gethostbyname(sys.argv[1]), 'reverse': rev(sys.argv[2]),"
           " 'unknown': rev('10.255.254.253'), 'resolv': open('/etc/resolv.conf').read()}))")


def test_names_resolve_inside_the_lab_from_its_hosts_file():
    """Each machine finds its peers by name and by address in its own /etc/hosts, and a name no file
    holds fails from the machine's own resolver (no DNS a namespace cannot reach, as gloo's lookups found)."""
    lab = start_lab(2)
    try:
        out = subprocess.run([*lab.prefix(1), sys.executable, "-c", LOOKUPS, lab.machine(2).name, lab.address(2)],
                             capture_output=True, text=True, check=True, timeout=60).stdout
        seen = json.loads(out)
        assert seen["peer"] == lab.address(2)
        assert seen["reverse"] == lab.machine(2).name
        assert seen["unknown"].startswith("error")
        assert "nameserver 127.0.0.1" in seen["resolv"]
    finally:
        lab.close()


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


# -- topology, shaping, leftovers -------------------------------------------------------------------
def test_a_topology_string_names_regions_zones_and_machines():
    topo = Topology.parse("2r x 3z x 5m")
    assert topo.count == 30
    assert list(topo.regions) == ["r1", "r2"]
    assert topo.regions["r2"] == {"r2-a": 5, "r2-b": 5, "r2-c": 5}
    assert Topology.parse("4m").regions == {"r1": {"r1-a": 4}}
    with pytest.raises(ValueError, match="regions x zones x machines"):
        Topology.parse("2 regions")
    with pytest.raises(ValueError, match="at least one machine"):
        Topology({"r1": {"a": 0}})


def test_each_zone_has_its_own_address_block():
    lab = start_lab(Topology({"r1": {"a": 3, "b": 2}, "r2": {"c": 1}}))
    try:
        by_zone = {}
        for m in lab.machines:
            by_zone.setdefault(m.zone, []).append(m)
        assert [m.index for m in lab.machines] == list(range(1, 7))
        assert [m.name for m in by_zone["a"]] == ["a-m1", "a-m2", "a-m3"]
        for k, zone in enumerate(["a", "b", "c"]):
            block = lab.zone_block(k)
            assert all(ipaddress.ip_address(m.address) in block for m in by_zone[zone])
            assert ipaddress.ip_address(lab.host_address) not in block
            assert block.subnet_of(lab.subnet)
        assert len({m.address for m in lab.machines}) == 6
    finally:
        lab.close()


RECEIVE = "import socket,sys\ns=socket.create_server((sys.argv[1],0));print(s.getsockname()[1],flush=True)\n" \
          "c,_=s.accept()\nn=0\nwhile (b:=c.recv(1<<16)): n+=len(b)\nprint(n,flush=True)"
SEND = "import socket,sys\nc=socket.create_connection((sys.argv[1],int(sys.argv[2])));c.sendall(b'x'*int(sys.argv[3]))"


def move_bytes(lab: NetnsLab, src: int, dst: int | None, n: int) -> None:
    """``n`` bytes over TCP from machine ``src`` to machine ``dst`` (``None``: the bridge, where Redis is)."""
    host = lab.host_address if dst is None else lab.address(dst)
    recv = subprocess.Popen([*(lab.prefix(dst) if dst else []), sys.executable, "-c", RECEIVE, host],
                            stdout=subprocess.PIPE, text=True)
    try:
        port = recv.stdout.readline().strip()
        subprocess.run([*lab.prefix(src), sys.executable, "-c", SEND, host, port, str(n)], check=True, timeout=60)
        assert int(recv.stdout.readline()) == n
        recv.wait(30)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()


def test_traffic_goes_through_the_class_of_its_link():
    """Bytes to a peer in the zone, in another zone of the region, in another region, and to Redis's bridge
    address: each lands in its htb class on the sender's eth0 (the rates are measured by benchmarks/lab_network.py)."""
    lab = start_lab(Topology({"r1": {"a": 2, "b": 1}, "r2": {"c": 1}}), Shaping("2gbit", "200mbit"))
    n = 2_000_000
    try:
        for dst, kind in ((2, "in-zone"), (3, "cross-zone"), (4, "cross-region"), (None, "in-zone")):
            before = lab.class_bytes(1)
            move_bytes(lab, 1, dst, n)
            sent = {k: v - before[k] for k, v in lab.class_bytes(1).items()}
            assert sent[kind] >= n, (dst, sent)
            assert all(v < n / 10 for k, v in sent.items() if k != kind), (dst, sent)
        rates = netns._run([*lab.prefix(1), "tc", "class", "show", "dev", "eth0"])
        assert "class htb 1:20 root prio 0 rate 2Gbit" in rates and "class htb 1:30 root prio 0 rate 200Mbit" in rates
    finally:
        lab.close()


def lab_names(tag: str) -> list[str]:
    return [n for names in netns.leftovers(tag).values() for n in names]


def test_a_lab_killed_mid_build_is_cleaned_and_a_live_one_is_not():
    """`up` SIGKILLed while it builds leaves namespaces and links; `clean` finds them by the tag and deletes them,
    and leaves alone a lab whose owner (this process) still runs."""
    live = start_lab(2)
    tag = next(t for t in (os.urandom(2).hex() for _ in range(100)) if not netns.leftovers(t))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    up = subprocess.Popen([sys.executable, "-m", "gpulayer.lab.netns", "up", "--topology", "40m", "--tag", tag],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: len(lab_names(tag)) >= 6 or up.poll() is not None, 60, "the lab to be half built")
        up.send_signal(signal.SIGKILL)
        up.wait(10)
        assert up.returncode == -signal.SIGKILL, "`up` finished before it was killed; build a bigger lab"
        assert netns.STATE_DIR.joinpath(f"{tag}.json").exists() and lab_names(tag)
        deleted = netns.clean()
        assert deleted and lab_names(tag) == [] and not netns.STATE_DIR.joinpath(f"{tag}.json").exists()
        assert netns.leftovers(live.names.tag), "clean deleted a lab whose owner is alive"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        netns.clean(tag)
        live.close()
    assert lab_names(live.names.tag) == []


def test_up_and_down_build_and_delete_a_shaped_lab():
    tag = next(t for t in (os.urandom(2).hex() for _ in range(100)) if not netns.leftovers(t))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    run = lambda *a: subprocess.run([sys.executable, "-m", "gpulayer.lab.netns", *a], env=env, capture_output=True,
                                    text=True, timeout=120)
    try:
        up = run("up", "--topology", "2r x 1z x 2m", "--tag", tag)
        if up.returncode and "root" in up.stderr:
            pytest.skip(up.stderr)
        assert up.returncode == 0, up.stderr
        state = json.loads(up.stdout)
        assert [m["zone"] for m in state["machines"]] == ["r1-a", "r1-a", "r2-a", "r2-a"]
        lab = netns.load(tag)
        assert lab.address(3) == state["machines"][2]["address"]
        assert lab.class_bytes(1).keys() == {"in-zone", "cross-zone", "cross-region"}
        netns.clean()
        assert lab_names(tag), "clean must keep a lab built by `up` until `down`"
        assert run("down", "--tag", tag).returncode == 0
        assert lab_names(tag) == []
    finally:
        netns.clean(tag)
