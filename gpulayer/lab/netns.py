"""Simulated machines on one host: network namespaces on a veth bridge, grouped into zones and regions.

Each namespace is a "machine" with its own address, so workers started in it (through ``prefix(i)``)
advertise and listen on distinct addresses, as on separate machines. Redis listens on the bridge
address in the root namespace.

The topology API (for benchmarks that need machines in zones and regions)::

    topo = Topology.parse("2r x 3z x 5m")      # or Topology({"r1": {"r1-a": 5, "r1-b": 5}, "r2": {"r2-a": 4}})
    with NetnsLab(topo, shaping=Shaping()) as lab:   # Shaping(): 2 Gbit/s across zones, 200 Mbit/s across regions
        for m in lab.machines:                  # Machine(index, name, zone, region, address), index from 1
            fleet.add_worker(m.name, zone=m.zone, region=m.region, prefix=lab.prefix(m.index),
                             advertise_addr=m.address)
        lab.host_address                         # the bridge: where Redis listens (bind it there)
        lab.class_bytes(1)                       # {"in-zone": n, "cross-zone": n, "cross-region": n} sent by machine 1

``NetnsLab(n)`` is the same lab with one zone of ``n`` machines and no shaping.

Addresses: each zone has its own aligned block of the lab's subnet (the bridge sits in block 0), so
a machine's shaping needs one ``u32`` filter per other zone. Shaping is on each machine's ``eth0``
egress: an ``htb`` root with three classes, ``1:10`` in-zone (unlimited; also everything to the
bridge, i.e. the control plane to Redis, and anything unmatched), ``1:20`` cross-zone and ``1:30``
cross-region. Traffic is slowed by rate only: this kernel has no ``netem``, so no link adds delay.

Lifetime: every name carries one random tag (``gl<tag>...``), so parallel labs don't collide; a
state file ``/run/gpulayer-netns/<tag>.json`` names the process that owns the lab. ``close()``
deletes everything; after a crash, ``clean()`` deletes every lab whose owner is gone (or one tag).
One command builds a lab and one tears it down::

    python -m gpulayer.lab.netns up --topology "2r x 3z x 5m" [--tag ab12] [--no-shaping]   # prints the machines
    python -m gpulayer.lab.netns down --tag ab12
    python -m gpulayer.lab.netns clean [--tag ab12]    # leftovers of crashed labs (owner pid dead)

Needs root, ``ip`` and ``tc`` (iproute2).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import GpulayerError

# Random aligned blocks of 10.231.0.0/16: a private range that hosts and clouds rarely use.
_SPACE = ipaddress.ip_network("10.231.0.0/16")
STATE_DIR = Path("/run/gpulayer-netns")
# ``ip netns exec NAME`` mounts /etc/netns/NAME/<file> over /etc/<file> for what it runs.
ETC_NETNS = Path("/etc/netns")
# Inside a namespace the host's nameserver is unreachable, so a lookup that reaches DNS waited out its
# timeouts (10 s for a reverse lookup: gloo's rendezvous paid 20 s of them per job). A cloud's
# resolver answers in a millisecond: each machine gets a hosts file naming the whole lab, and a
# nameserver on its own loopback, where nothing listens, so anything else fails at once.
RESOLV_CONF = "# gpulayer lab: no DNS here; names are in /etc/hosts\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
CLASSES = {"in-zone": "1:10", "cross-zone": "1:20", "cross-region": "1:30"}
_TAG = re.compile(r"^[0-9a-f]{4}$")


class NetnsUnavailable(GpulayerError):
    """Network namespaces cannot be made here (not root, no ``ip``, or the kernel refused)."""


# -- topology ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Machine:
    """One simulated machine: namespace ``index`` (from 1), its worker's name, zone, region and address."""

    index: int
    name: str
    zone: str
    region: str
    address: str = ""


@dataclass(frozen=True)
class Topology:
    """Machines per zone per region: ``{region: {zone: machines}}``, in order (machine 1 is the first zone's first)."""

    regions: dict[str, dict[str, int]]

    def __post_init__(self):
        zones = [z for zs in self.regions.values() for z in zs]
        if not zones or len(set(zones)) != len(zones):
            raise ValueError(f"a topology needs at least one zone and unique zone names: {self.regions}")
        if any(n < 1 for zs in self.regions.values() for n in zs.values()):
            raise ValueError(f"every zone needs at least one machine: {self.regions}")

    @classmethod
    def parse(cls, text: str) -> Topology:
        """``"2r x 3z x 5m"`` (2 regions, 3 zones each, 5 machines each), ``"4m"``, ``"2z x 4m"``."""
        counts = {"r": 1, "z": 1, "m": 1}
        for part in text.replace("*", "x").split("x"):
            m = re.fullmatch(r"\s*(\d+)\s*([rzm])\s*", part)
            if not m:
                raise ValueError(f"cannot read topology {text!r}: write e.g. '2r x 3z x 5m' (regions x zones x machines)")
            counts[m.group(2)] = int(m.group(1))
        return cls({f"r{r}": {f"r{r}-{chr(ord('a') + z)}": counts["m"] for z in range(counts["z"])}
                    for r in range(1, counts["r"] + 1)})

    @classmethod
    def single_zone(cls, count: int) -> Topology:
        return cls({"region-1": {"zone-a": count}})

    def zones(self) -> list[tuple[str, str, int]]:
        """``(region, zone, machines)`` in order."""
        return [(r, z, n) for r, zs in self.regions.items() for z, n in zs.items()]

    @property
    def count(self) -> int:
        return sum(n for _, _, n in self.zones())

    def describe(self) -> str:
        return "; ".join(f"{r}: " + ", ".join(f"{z} x {n}" for z, n in zs.items()) for r, zs in self.regions.items())


@dataclass(frozen=True)
class Shaping:
    """Egress rates (``tc`` syntax) by where the traffic goes; in-zone and the control plane stay unlimited."""

    cross_zone: str = "2gbit"
    cross_region: str = "200mbit"

    def describe(self) -> str:
        return f"in-zone unlimited, cross-zone {self.cross_zone}, cross-region {self.cross_region} (rate only, no delay)"


def _block_size(topology: Topology) -> int:
    biggest = max(n for _, _, n in topology.zones())
    return max(8, 1 << (biggest - 1).bit_length())


def _plan(topology: Topology) -> tuple[int, int]:
    """(zone block size, subnet prefix length): block 0 for the bridge, one block per zone, room for broadcast."""
    block = _block_size(topology)
    need = block * (len(topology.zones()) + 1) + 1
    size = 1 << (need - 1).bit_length()
    if size > 4096:
        raise ValueError(f"topology {topology.describe()} needs {need} addresses; a lab holds at most 4096")
    return block, 32 - size.bit_length() + 1


# -- names, commands, state -------------------------------------------------------------------------
@dataclass(frozen=True)
class LabNames:
    """Every name the lab creates, from one tag (interface names must fit in 15 characters)."""

    tag: str

    @property
    def bridge(self) -> str:
        return f"glbr{self.tag}"

    def namespace(self, i: int) -> str:
        return f"gl{self.tag}-n{i}"

    def host_veth(self, i: int) -> str:
        return f"gl{self.tag}v{i}"  # stays in the root namespace, enslaved to the bridge

    def peer_veth(self, i: int) -> str:
        return f"gl{self.tag}p{i}"  # moved into namespace i and renamed ``eth0``

    def owns(self, name: str) -> bool:
        return re.fullmatch(rf"glbr{self.tag}|gl{self.tag}(-n|v|p)\d+", name) is not None


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as err:
        raise NetnsUnavailable(f"`{' '.join(cmd)}` failed with code {err.returncode}: "
                               f"{err.stderr.strip() or 'no message'}") from err


def _ip(*args: str) -> str:
    return _run(["ip", *args])


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Networks of this host's IPv4 addresses and routes (the default route excluded)."""
    nets = []
    for line in _ip("-4", "-o", "addr", "show").splitlines():
        words = line.split()
        if "inet" in words:
            nets.append(ipaddress.ip_interface(words[words.index("inet") + 1]).network)
    for line in _ip("-4", "route", "show").splitlines():
        dest = line.split()[0] if line.strip() else "default"
        if dest != "default":
            nets.append(ipaddress.ip_network(dest, strict=False))
    return nets


def _free_subnet(prefixlen: int, attempts: int = 32) -> ipaddress.IPv4Network:
    used = _used_networks()
    candidates = list(_SPACE.subnets(new_prefix=prefixlen))
    for _ in range(attempts):
        net = random.choice(candidates)
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetnsUnavailable(f"no free /{prefixlen} in {_SPACE} after {attempts} tries "
                           f"(in use: {', '.join(map(str, used))})")


def _owner_alive(state: dict) -> bool:
    pid = state.get("owner")
    if not pid:
        return True  # built by `up`: kept until `down`
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- the lab ----------------------------------------------------------------------------------------
class NetnsLab:
    """A bridge in the root namespace and one namespace per machine of ``topology``, numbered from 1.

    ``topology``: a :class:`Topology`, its string form, or a machine count (one zone);
    ``shaping``: rates between zones and regions (``None``: unshaped).
    """

    def __init__(self, topology: Topology | str | int = 2, shaping: Shaping | None = None, tag: str | None = None):
        if isinstance(topology, int):
            topology = Topology.single_zone(topology)
        elif isinstance(topology, str):
            topology = Topology.parse(topology)
        if not 1 <= topology.count <= 250:
            raise ValueError(f"NetnsLab needs between 1 and 250 machines, not {topology.count}")
        if tag is not None and not _TAG.match(tag):
            raise ValueError(f"a lab tag is 4 hex digits (e.g. ab12), not {tag!r}")
        self.topology = topology
        self.shaping = shaping
        self.count = topology.count
        self.names = LabNames(tag or secrets.token_hex(2))
        self.block, self._prefixlen = _plan(topology)
        self.subnet: ipaddress.IPv4Network | None = None
        self.machines: list[Machine] = []
        self._undo: list[tuple[str, ...]] = []  # `ip` commands that delete what we made, newest last
        self._etc: list[Path] = []  # the machines' /etc/netns folders

    # -- addresses and commands -----------------------------------------------------------------
    @property
    def host_address(self) -> str:
        """The bridge's address in the root namespace: where Redis listens."""
        return str(self._subnet()[1])

    def address(self, i: int) -> str:
        """Machine ``i``'s address on the bridge."""
        return self.machine(i).address

    def machine(self, i: int) -> Machine:
        self._subnet()
        return self.machines[self._check(i) - 1]

    def namespace(self, i: int) -> str:
        return self.names.namespace(self._check(i))

    def prefix(self, i: int) -> list[str]:
        """A command prefix that runs a command inside machine ``i``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(i)]

    def zone_block(self, zone_number: int) -> ipaddress.IPv4Network:
        """The address block of the ``zone_number``-th zone (from 0, topology order)."""
        base = self._subnet().network_address + self.block * (zone_number + 1)
        return ipaddress.ip_network(f"{base}/{32 - self.block.bit_length() + 1}")

    def _check(self, i: int) -> int:
        if not 1 <= i <= self.count:
            raise IndexError(f"machine {i} does not exist; this lab has machines 1..{self.count}")
        return i

    def _subnet(self) -> ipaddress.IPv4Network:
        if self.subnet is None:
            raise RuntimeError("the lab is not started; use `with NetnsLab(...) as lab:` or call start()")
        return self.subnet

    def _layout(self) -> list[Machine]:
        out, i = [], 1
        for k, (region, zone, n) in enumerate(self.topology.zones()):
            block = self.zone_block(k)
            for j in range(n):
                out.append(Machine(i, f"{zone}-m{j + 1}", zone, region, str(block[j])))
                i += 1
        return out

    # -- lifetime -------------------------------------------------------------------------------
    def start(self, owner: int | None = -1) -> NetnsLab:
        """Build the lab. ``owner``: the pid whose death makes it a leftover for ``clean()`` once built (default
        this process; ``None``: kept until ``down``/``close``). While it builds, this process owns it."""
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root (running as uid "
                                   f"{os.geteuid()}); run as root or in a privileged container")
        for tool in ("ip", "tc") if self.shaping else ("ip",):
            if shutil.which(tool) is None:
                raise NetnsUnavailable(f"no `{tool}` command on PATH; install iproute2 (apt install iproute2)")
        try:
            self._write_state(os.getpid(), building=True)
            self._build()
            self._write_state(os.getpid() if owner == -1 else owner, building=False)
        except BaseException:
            self.close()
            raise
        return self

    def _state_path(self) -> Path:
        return STATE_DIR / f"{self.names.tag}.json"

    def _write_state(self, owner: int | None, building: bool) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        if building and self._state_path().exists():
            raise NetnsUnavailable(f"a lab tagged {self.names.tag} already exists; pick another tag or "
                                   f"`python -m gpulayer.lab.netns down --tag {self.names.tag}`")
        state = {"tag": self.names.tag, "owner": owner, "building": building, "topology": self.topology.regions,
                 "shaping": asdict(self.shaping) if self.shaping else None,
                 "subnet": str(self.subnet) if self.subnet else None,
                 "host_address": self.host_address if self.subnet else None,
                 "machines": [asdict(m) | {"namespace": self.namespace(m.index)} for m in self.machines]}
        tmp = self._state_path().with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self._state_path())

    def _build(self) -> None:
        n = self.names
        self.subnet = _free_subnet(self._prefixlen)
        self.machines = self._layout()
        plen = self.subnet.prefixlen
        _ip("link", "add", n.bridge, "type", "bridge")
        self._undo.append(("link", "del", n.bridge))
        _ip("addr", "add", f"{self.host_address}/{plen}", "dev", n.bridge)
        _ip("link", "set", n.bridge, "up")
        for m in self.machines:
            i = m.index
            ns, host, peer = n.namespace(i), n.host_veth(i), n.peer_veth(i)
            _ip("netns", "add", ns)
            self._undo.append(("netns", "del", ns))
            _ip("link", "add", host, "type", "veth", "peer", "name", peer)
            # Deleting either end of a veth pair deletes both, wherever the other end is.
            self._undo.append(("link", "del", host))
            _ip("link", "set", peer, "netns", ns)
            _ip("-n", ns, "link", "set", peer, "name", "eth0")
            _ip("link", "set", host, "master", n.bridge)
            _ip("link", "set", host, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{m.address}/{plen}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "route", "add", "default", "via", self.host_address)
            if self.shaping:
                self._shape(m)
        self._write_etc()

    def _write_etc(self) -> None:
        """Each machine's /etc/hosts (the host's, then every lab machine by name) and resolv.conf."""
        try:
            base = Path("/etc/hosts").read_text()
        except OSError:
            base = "127.0.0.1 localhost\n"
        lab = "".join(f"{m.address} {m.name}\n" for m in self.machines)
        hosts = f"{base.rstrip()}\n# gpulayer lab {self.names.tag}\n{self.host_address} gpulayer-lab-host\n{lab}"
        for m in self.machines:
            folder = ETC_NETNS / self.namespace(m.index)
            folder.mkdir(parents=True, exist_ok=True)
            self._etc.append(folder)
            (folder / "hosts").write_text(hosts)
            (folder / "resolv.conf").write_text(RESOLV_CONF)

    def _shape(self, m: Machine) -> None:
        """htb on the machine's eth0: in-zone (default) unlimited, other zones by destination block."""
        tc = ["ip", "netns", "exec", self.namespace(m.index), "tc"]
        dev = ["dev", "eth0"]
        _run([*tc, "qdisc", "add", *dev, "root", "handle", "1:", "htb", "default", "10", "r2q", "1000"])
        rates = {"1:10": "100gbit", "1:20": self.shaping.cross_zone, "1:30": self.shaping.cross_region}
        for classid, rate in rates.items():
            # A burst of ~1 ms at the rate (at least 64 KiB: veth hands htb 64 KiB GSO segments).
            burst = "1mb" if classid == "1:10" else _burst(rate)
            _run([*tc, "class", "add", *dev, "parent", "1:", "classid", classid, "htb", "rate", rate, "ceil", rate,
                  "burst", burst, "cburst", burst])
        for k, (region, zone, _) in enumerate(self.topology.zones()):
            if zone == m.zone:
                continue
            flow = CLASSES["cross-zone" if region == m.region else "cross-region"]
            _run([*tc, "filter", "add", *dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                  "match", "ip", "dst", str(self.zone_block(k)), "flowid", flow])

    def class_bytes(self, i: int) -> dict[str, int]:
        """Bytes machine ``i`` has sent through each shaping class (``tc -s class show``)."""
        out = _run([*self.prefix(i), "tc", "-s", "class", "show", "dev", "eth0"])
        sent = {}
        for classid, stats in re.findall(r"class htb (\d+:\d+) .*?\n\s*Sent (\d+) bytes", out):
            sent[classid] = int(stats)
        return {kind: sent.get(classid, 0) for kind, classid in CLASSES.items()}

    def close(self) -> None:
        """Delete everything this lab made, newest first. Safe to call twice."""
        errors = []
        while self._undo:
            cmd = self._undo.pop()
            try:
                _ip(*cmd)
            except NetnsUnavailable as err:
                if "Cannot find device" not in str(err) and "No such file" not in str(err):
                    errors.append(str(err))
        while self._etc:
            shutil.rmtree(self._etc.pop(), ignore_errors=True)
        if errors:
            raise NetnsUnavailable("could not delete everything the lab made: " + "; ".join(errors))
        self._state_path().unlink(missing_ok=True)

    def __enter__(self) -> NetnsLab:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _burst(rate: str) -> str:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        return "64kb"
    bits = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return f"{max(64, int(bits / 8 / 1000 / 1024))}kb"


# -- leftovers --------------------------------------------------------------------------------------
def leftovers(tag: str | None = None) -> dict[str, list[str]]:
    """What labs left on this host: ``{tag: [namespaces and links]}`` (one tag, or every lab's)."""
    found: dict[str, list[str]] = {}
    names = [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]
    names += [line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link").splitlines()]
    names += [f.name for f in ETC_NETNS.iterdir()] if ETC_NETNS.is_dir() else []
    for name in sorted(set(names)):
        m = re.fullmatch(r"glbr([0-9a-f]{4})|gl([0-9a-f]{4})(?:-n|v|p)\d+", name)
        if m and (tag is None or tag in m.groups()):
            found.setdefault(m.group(1) or m.group(2), []).append(name)
    if STATE_DIR.exists():
        for f in STATE_DIR.glob("*.json"):
            if tag is None or f.stem == tag:
                found.setdefault(f.stem, [])
    return found


def clean(tag: str | None = None) -> list[str]:
    """Delete lab ``tag``, or (no tag) every lab whose owner process is gone; returns what was deleted.

    Namespaces and links with a lab's tag are found by name, so a lab killed mid-build (before it
    made them all) is cleaned too: its state file is written before anything else. Without a tag,
    a lab with no state file (made by an older gpulayer) or whose owner still runs is left alone.
    """
    deleted = []
    namespaces = {line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()}
    for t, names in leftovers(tag).items():
        state_file = STATE_DIR / f"{t}.json"
        if tag is None:
            try:
                if _owner_alive(json.loads(state_file.read_text())):
                    continue
            except (OSError, ValueError):
                continue
        for name in sorted(names, key=lambda s: (not s.startswith("glbr"), s)):
            shutil.rmtree(ETC_NETNS / name, ignore_errors=True)  # a namespace's /etc files, if any
            if "-n" in name and name not in namespaces:
                deleted.append(name)
                continue
            kind = ("netns", "del") if "-n" in name else ("link", "del")
            try:
                _ip(*kind, name)
                deleted.append(name)
            except NetnsUnavailable:
                pass  # the other end of a veth already took it
        state_file.unlink(missing_ok=True)
    return deleted


def load(tag: str) -> NetnsLab:
    """The lab ``tag`` built by ``up`` (or still running elsewhere), read from its state file."""
    path = STATE_DIR / f"{tag}.json"
    if not path.exists():
        raise NetnsUnavailable(f"no lab tagged {tag} on this host (no {path}); `python -m gpulayer.lab.netns up` builds one")
    state = json.loads(path.read_text())
    lab = NetnsLab(Topology(state["topology"]), Shaping(**state["shaping"]) if state["shaping"] else None, tag=tag)
    lab.subnet = ipaddress.ip_network(state["subnet"])
    lab.machines = [Machine(**{k: v for k, v in m.items() if k != "namespace"}) for m in state["machines"]]
    return lab


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpulayer.lab.netns", description="Build, show and delete netns labs.")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="build a lab and keep it until `down`")
    up.add_argument("--topology", default="2r x 3z x 5m")
    up.add_argument("--tag", default=None)
    up.add_argument("--cross-zone", default=Shaping.cross_zone)
    up.add_argument("--cross-region", default=Shaping.cross_region)
    up.add_argument("--no-shaping", action="store_true")
    for name in ("down", "show"):
        sub.add_parser(name).add_argument("--tag", required=True)
    sub.add_parser("clean", help="delete labs whose owner is gone (or --tag)").add_argument("--tag", default=None)
    a = p.parse_args(argv)
    try:
        if a.cmd == "up":
            shaping = None if a.no_shaping else Shaping(a.cross_zone, a.cross_region)
            lab = NetnsLab(a.topology, shaping, tag=a.tag).start(owner=None)
            print(json.dumps(json.loads(lab._state_path().read_text()), indent=1))
        elif a.cmd == "show":
            print((STATE_DIR / f"{load(a.tag).names.tag}.json").read_text())
        elif a.cmd == "down":
            print("deleted", len(clean(a.tag)), "namespaces and links")
        else:
            deleted = clean(a.tag)
            print(f"deleted {len(deleted)}: {' '.join(deleted)}" if deleted else "nothing left behind")
    except (NetnsUnavailable, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
