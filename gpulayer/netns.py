"""Several "machines" on one host: Linux network namespaces on a private veth bridge.

Each namespace gets its own address, so workers started in them (through
``prefix(i)``) advertise and listen on distinct addresses, as on separate
machines. Redis listens on the bridge address in the root namespace.

>>> with NetnsLab(2) as lab:
...     fleet = Fleet(tmp_path, bind=f"127.0.0.1 {lab.host_address}", host=lab.host_address)
...     fleet.add_worker("ns-1", prefix=lab.prefix(1), advertise_addr=lab.address(1))

Needs root and ``ip`` (iproute2). Everything the lab creates carries one random
tag, so parallel runs don't collide, and is deleted by ``close()``.
"""

from __future__ import annotations

import ipaddress
import os
import random
import secrets
import shutil
import subprocess
from dataclasses import dataclass

from .errors import GpulayerError

# 10.231.<Y>.0/24, Y random: a private range that hosts and clouds rarely use.
_SUBNET_PREFIX = "10.231"
_FIRST_HOST = 10  # namespace i gets .(10 + i); the bridge is .1


class NetnsUnavailable(GpulayerError):
    """Network namespaces cannot be made here (not root, no ``ip``, or the kernel refused)."""


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


def _ip(*args: str) -> str:
    cmd = ["ip", *args]
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as err:
        raise NetnsUnavailable(f"`{' '.join(cmd)}` failed with code {err.returncode}: "
                               f"{err.stderr.strip() or 'no message'}") from err


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


def _free_subnet(attempts: int = 32) -> ipaddress.IPv4Network:
    used = _used_networks()
    for _ in range(attempts):
        net = ipaddress.ip_network(f"{_SUBNET_PREFIX}.{random.randrange(256)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetnsUnavailable(f"no free /24 in {_SUBNET_PREFIX}.0.0/16 after {attempts} tries "
                           f"(in use: {', '.join(map(str, used))})")


class NetnsLab:
    """A bridge in the root namespace and ``count`` namespaces on it, numbered from 1."""

    def __init__(self, count: int = 2):
        if count < 1 or count > 200:
            raise ValueError(f"NetnsLab needs between 1 and 200 namespaces, not {count}")
        self.count = count
        self.names = LabNames(secrets.token_hex(2))
        self.subnet: ipaddress.IPv4Network | None = None
        self._undo: list[tuple[str, ...]] = []  # `ip` commands that delete what we made, newest last

    # -- addresses and commands -----------------------------------------------------------------
    @property
    def host_address(self) -> str:
        """The bridge's address in the root namespace: where Redis listens."""
        return str(self._subnet()[1])

    def address(self, i: int) -> str:
        """Namespace ``i``'s address on the bridge."""
        return str(self._subnet()[_FIRST_HOST + self._check(i)])

    def namespace(self, i: int) -> str:
        return self.names.namespace(self._check(i))

    def prefix(self, i: int) -> list[str]:
        """A command prefix that runs a command inside namespace ``i``."""
        return ["ip", "netns", "exec", self.namespace(i)]

    def _check(self, i: int) -> int:
        if not 1 <= i <= self.count:
            raise IndexError(f"namespace {i} does not exist; this lab has namespaces 1..{self.count}")
        return i

    def _subnet(self) -> ipaddress.IPv4Network:
        if self.subnet is None:
            raise RuntimeError("the lab is not started; use `with NetnsLab(n) as lab:` or call start()")
        return self.subnet

    # -- lifetime -------------------------------------------------------------------------------
    def start(self) -> NetnsLab:
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root (running as uid "
                                   f"{os.geteuid()}); run as root or in a privileged container")
        if shutil.which("ip") is None:
            raise NetnsUnavailable("no `ip` command on PATH; install iproute2 (apt install iproute2)")
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        n = self.names
        self.subnet = _free_subnet()
        plen = self.subnet.prefixlen
        _ip("link", "add", n.bridge, "type", "bridge")
        self._undo.append(("link", "del", n.bridge))
        _ip("addr", "add", f"{self.host_address}/{plen}", "dev", n.bridge)
        _ip("link", "set", n.bridge, "up")
        for i in range(1, self.count + 1):
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
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/{plen}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "route", "add", "default", "via", self.host_address)

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
        if errors:
            raise NetnsUnavailable("could not delete everything the lab made: " + "; ".join(errors))

    def __enter__(self) -> NetnsLab:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
