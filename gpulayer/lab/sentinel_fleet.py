"""A throwaway fleet whose broker is a Sentinel group: a primary, replicas and sentinels on loopback
(``local/sentinel_group.py``), with real workers, for the tests and benchmarks of a failover.

>>> with SentinelFleet(tmp_path, secret="s", password="pw") as fleet:
...     fleet.add_worker("w1")
...     fleet.kill_primary()          # SIGKILL; the sentinels promote the replica
"""

from __future__ import annotations

import os
import signal

from ..local.sentinel_group import SentinelGroup
from .fleet import Fleet


class SentinelFleet(Fleet):
    """A :class:`Fleet` on a Sentinel group instead of one Redis; ``fleet.url`` is the ``sentinel://`` URL."""

    def __init__(self, workdir, secret: str, password: str | None = None, *, replicas: int = 1, sentinels: int = 3,
                 down_after_ms: int = 2000, failover_timeout_ms: int = 10000, **kwargs):
        super().__init__(workdir, secret=secret, password=password, **kwargs)
        self.group = SentinelGroup(self.workdir / "group", password, replicas=replicas, sentinels=sentinels,
                                   down_after_ms=down_after_ms, failover_timeout_ms=failover_timeout_ms)

    def pids(self) -> set[int]:
        procs = [*self.group.procs.values(), *self.workers.values()]
        return {p.pid for p in procs if p is not None and p.poll() is None}

    def start_redis(self, tls=None) -> None:
        """``tls`` (a ``TlsFiles``): every server and sentinel speaks TLS only; ``url`` is ``sentinels://``."""
        if tls is not None:
            self.tls = tls
            self.group.tls = tls.redis_directives()
            self.group.client_tls = {k: v for k, v in tls.client_options().items() if v}
        self.group.server_ports = []
        self.group.start()
        self.port = self.group.server_ports[0]
        self.url = self.group.url
        self.redis_proc = self.group.procs[self.port]

    def stop_redis(self) -> None:
        self.group.stop()
        self.redis_proc = None

    def kill_primary(self, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to the server the sentinels name as primary now; its port."""
        port = self.group.primary_port()
        os.kill(self.group.procs[port].pid, sig)
        return port
