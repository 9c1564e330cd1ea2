"""A Redis Sentinel group on loopback: a primary, its replicas and the sentinels watching them, all the one
``redis-server`` binary the embedded cluster uses (``redis_server.py``).

``gpulayer up --replicas 1 --sentinels 3`` runs one, and the tests and benchmarks start theirs with it. The
sentinels mark a primary down after ``down_after_ms`` (2 s here, 30 s in Sentinel's own default), so a laptop
can watch a failover: kill the primary (``gpulayer status`` names it, ``gpulayer up`` prints the pids) and a
replica takes over.

A server that dies is started again (same port, same data) only after ``restart_after`` seconds: at once, a
killed primary would be back before the sentinels noticed, and no failover would ever be seen. It comes back
as a replica of whichever server is the primary then (the sentinels reconfigure it), and resyncs at once
(``repl-diskless-sync-delay 0``): until then a one-replica group has no replica, and a "replicated" write waits.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from ..deadline import Deadline
from ..errors import ClusterUnavailable
from ..procs.env import free_port
from ..procs.stop import kill_now, stop
from .redis_server import find_redis_server, launch, start_redis, wait_for_redis, write_redis_conf

SERVICE = "gpulayer"  # the group's name (Sentinel's "master name")
DOWN_AFTER_MS = 2000
FAILOVER_TIMEOUT_MS = 10000


def start_sentinel(data_dir: Path, *, port: int, service: str, primary_port: int, password: str | None,
                   quorum: int, down_after_ms: int, failover_timeout_ms: int, log_file: Path | None = None,
                   tie_to_parent: bool = False, tls: dict[str, str] | None = None) -> subprocess.Popen:
    """``redis-server sentinel.conf --sentinel`` watching the primary on ``primary_port`` (loopback).

    The password (``auth-pass``) is in the 0600 sentinel.conf, never on the command line; the sentinel
    rewrites that file as it learns the group (its replicas, its peers, a new primary). ``tls``: redis-server's
    TLS directives: the sentinel then speaks TLS only, to its clients and to the servers."""
    data_dir.mkdir(parents=True, exist_ok=True)
    conf = [("bind", "127.0.0.1"), ("port", str(port)), ("dir", str(data_dir)), ("daemonize", "no"),
            ("sentinel", "monitor", service, "127.0.0.1", str(primary_port), str(quorum)),
            ("sentinel", "down-after-milliseconds", service, str(down_after_ms)),
            ("sentinel", "failover-timeout", service, str(failover_timeout_ms)),
            ("sentinel", "parallel-syncs", service, "1")]
    if tls:
        conf += [("port", "0"), ("tls-port", str(port)), ("tls-replication", "yes"), *tls.items()]
    if password:
        conf.append(("sentinel", "auth-pass", service, password))
    return launch([find_redis_server(), str(write_redis_conf(data_dir / "sentinel.conf", conf)), "--sentinel"],
                  log_file, tie_to_parent)


def distinct_free_ports(n: int) -> list[int]:
    """``n`` free loopback ports, all different (``free_port`` may hand the same one out twice in a row)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _connect(url: str, **kwargs) -> redis.Redis:
    """``store.connection.connect_redis``, the one way to open a client, imported when first used: the supervisor,
    which starts a group, imports no pydantic (``gpulayer.config`` does)."""
    from ..store.connection import connect_redis

    return connect_redis(url, **kwargs)


@dataclass
class SentinelGroup:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels under ``root``, on free loopback ports."""

    root: Path
    password: str | None
    replicas: int = 1
    sentinels: int = 3
    service: str = SERVICE
    down_after_ms: int = DOWN_AFTER_MS
    failover_timeout_ms: int = FAILOVER_TIMEOUT_MS
    tie_to_parent: bool = False
    restart_after: float | None = None  # seconds a dead process waits before tend() starts it again
    tls: dict[str, str] | None = None  # redis-server's TLS directives: every process speaks TLS only
    client_tls: dict[str, str] = field(default_factory=dict)  # ssl_* options of its clients (ssl_ca_certs, ...)
    server_ports: list[int] = field(default_factory=list)  # [first primary, replicas...]
    sentinel_ports: list[int] = field(default_factory=list)
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)  # port -> its process
    _dead_since: dict[int, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"sentinel{'s' if self.tls else ''}://{auth}{hosts}/{self.service}/0{self._query()}"

    def _query(self) -> str:
        given = {k: v for k, v in self.client_tls.items() if v}
        return "?" + "&".join(f"{k}={v}" for k, v in given.items()) if given else ""

    def server_url(self, port: int) -> str:
        """A plain ``redis://`` URL of one server of the group (a test's way to reach a replica itself)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis{'s' if self.tls else ''}://{auth}127.0.0.1:{port}/0{self._query()}"

    def start(self, timeout: float = 30.0) -> "SentinelGroup":
        if self.replicas < 1 or self.sentinels < 1:
            raise ClusterUnavailable(f"a Sentinel group needs at least 1 replica and 1 sentinel (asked: "
                                     f"--replicas {self.replicas} --sentinels {self.sentinels})")
        if not self.server_ports or not self.sentinel_ports:
            ports = distinct_free_ports(1 + self.replicas + self.sentinels)
            self.server_ports, self.sentinel_ports = ports[:1 + self.replicas], ports[1 + self.replicas:]
        for port in self.server_ports:
            self.procs[port] = self._start_server(port, replica_of=None if port == self.server_ports[0]
                                                  else self.server_ports[0])
        for port in self.server_ports:
            wait_for_redis(self.server_url(port), self.procs[port], timeout)
        for port in self.sentinel_ports:
            self.procs[port] = self._start_sentinel(port)
        self.wait_ready(timeout)
        self.wait_synced(timeout)  # replicas online: a "replicated" write sent at once is confirmed (durability)
        return self

    def _start_server(self, port: int, replica_of: int | None) -> subprocess.Popen:
        # A server that comes back (or a replica re-pointed at a new primary that cannot continue its stream)
        # resyncs in full: at once, not after Redis 7's 5 s wait for more replicas to share one transfer.
        directives: list[tuple[str, ...]] = [("repl-diskless-sync-delay", "0")]
        if self.password:
            directives.append(("masterauth", self.password))
        if replica_of is not None:
            directives.append(("replicaof", "127.0.0.1", str(replica_of)))
        if self.tls:
            directives.append(("tls-replication", "yes"))
        return start_redis(self.root / f"redis-{port}", port=port, password=self.password, directives=directives,
                           log_file=self.root / f"redis-{port}.log", tie_to_parent=self.tie_to_parent, tls=self.tls)

    def _start_sentinel(self, port: int) -> subprocess.Popen:
        return start_sentinel(self.root / f"sentinel-{port}", port=port, service=self.service,
                              primary_port=self.server_ports[0], password=self.password,
                              quorum=self.sentinels // 2 + 1, down_after_ms=self.down_after_ms,
                              failover_timeout_ms=self.failover_timeout_ms,
                              log_file=self.root / f"sentinel-{port}.log", tie_to_parent=self.tie_to_parent,
                              tls=self.tls)

    def sentinel_client(self, port: int | None = None) -> redis.Redis:
        url = f"redis{'s' if self.tls else ''}://127.0.0.1:{port or self.sentinel_ports[0]}/0{self._query()}"
        return _connect(url, socket_timeout=2, socket_connect_timeout=2, decode_responses=True)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every sentinel sees the primary, every replica and every other sentinel (a failover needs
        them to agree), or ``ClusterUnavailable``."""
        deadline = Deadline(timeout)
        seen: dict = {}
        while True:
            try:
                seen = {}
                for port in self.sentinel_ports:
                    with self.sentinel_client(port) as s:
                        state = s.sentinel_master(self.service)
                    seen[port] = (int(state["num-slaves"]), int(state["num-other-sentinels"]))
                if all(v == (self.replicas, self.sentinels - 1) for v in seen.values()):
                    return
            except redis.RedisError:
                pass
            if deadline.expired():
                raise ClusterUnavailable(f"the Sentinel group did not form within {timeout:.0f}s (sentinel port -> "
                                         f"(replicas, other sentinels) seen: {seen}); see the logs in {self.root}")
            time.sleep(0.1)

    def primary_port(self) -> int:
        """The port of the server the sentinels name as primary now."""
        with self.sentinel_client() as s:
            return int(s.sentinel_get_master_addr_by_name(self.service)[1])

    def wait_synced(self, timeout: float = 30.0) -> int:
        """Until every running replica has everything the primary had written when this was called (its
        replication offset), and every sentinel names the same primary; that primary's port."""
        deadline = Deadline(timeout)
        target = None
        while True:
            try:
                named = {int(s.sentinel_get_master_addr_by_name(self.service)[1])
                         for s in map(self.sentinel_client, self.sentinel_ports)}
                if len(named) == 1:
                    primary = named.pop()
                    with _connect(self.server_url(primary), socket_timeout=2) as c:  # (TLS: its query)
                        info = c.info("replication")
                    target = target or (primary, info["master_repl_offset"])
                    replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
                    running = sum(1 for p, proc in self.procs.items()
                                  if p in self.server_ports and p != primary and proc.poll() is None)
                    if (target[0] == primary and info["role"] == "master" and len(replicas) >= running
                            and all(r.get("state") == "online" and r.get("offset", 0) >= target[1] for r in replicas)):
                        return primary
                    if target[0] != primary:
                        target = None
            except (redis.RedisError, TypeError, IndexError):
                pass
            if deadline.expired():
                raise ClusterUnavailable(f"the Sentinel group's replicas did not catch up within {timeout:.0f}s; "
                                         f"see the logs in {self.root}")
            time.sleep(0.05)

    def _primary_or_none(self) -> int | None:
        try:
            return self.primary_port()
        except (redis.RedisError, TypeError, IndexError):
            return None

    def tend(self) -> list[str]:
        """Start again each process dead for ``restart_after`` seconds; what it did, one line each."""
        if self.restart_after is None:
            return []
        done, now = [], time.monotonic()
        for port, proc in list(self.procs.items()):
            if proc.poll() is None:
                self._dead_since.pop(port, None)
                continue
            since = self._dead_since.setdefault(port, now)
            if now - since < self.restart_after:
                continue
            del self._dead_since[port]
            if port in self.sentinel_ports:
                self.procs[port] = self._start_sentinel(port)
            else:  # from its own data, as a replica of the primary of the moment (the sentinels would make it one)
                primary = self._primary_or_none()
                self.procs[port] = self._start_server(port, replica_of=primary if primary != port else None)
            done.append(f"{'sentinel' if port in self.sentinel_ports else 'redis-server'} on port {port} exited "
                        f"with {proc.returncode}; started again")
        return done

    def pids(self) -> dict[str, int]:
        return {f"{'sentinel' if p in self.sentinel_ports else 'redis'}-{p}": proc.pid
                for p, proc in self.procs.items()}

    def stop(self, graceful: bool = True) -> None:
        """Stop every process this group started: the sentinels first (no failover while the servers stop)."""
        sentinels = [self.procs[p] for p in self.sentinel_ports if p in self.procs]
        servers = [self.procs[p] for p in self.server_ports if p in self.procs]
        if graceful:
            stop(sentinels, grace=5)
            stop(servers, grace=10)
        else:
            kill_now([*sentinels, *servers])
