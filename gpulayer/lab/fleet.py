"""A throwaway fleet for tests and benchmarks: a real Redis and real worker processes.

Everything runs on loopback, on free ports, and is stopped by its own pid.

>>> with Fleet(tmp_path) as fleet:
...     fleet.add_worker("w1", zone="z1")
...     fleet.connect()
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import redis

from .. import local
from ..config import with_tls
from ..deadline import Deadline, wait_until  # noqa: F401  (wait_until: the tests' and benchmarks' import)
from ..procs.env import free_port
from ..procs.stop import stop, stop_process
from ..store.connection import connect_redis
from ..store.registry import Registry


# A worker that neither imports torch at start (``GPULAYER_PRELOAD``) nor forks ranks from a warm template that
# imported it (``GPULAYER_WARM_RANKS``).
NO_TORCH_ENV = {"GPULAYER_PRELOAD": "", "GPULAYER_WARM_RANKS": "0"}


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a Redis that speaks TLS: the CA, Redis's certificate, and optionally a client certificate
    (then Redis refuses clients without one, so every connection must carry the client options)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path | None = None
    client_key: Path | None = None

    def redis_directives(self) -> dict[str, str]:
        return {"tls-cert-file": str(self.server_cert), "tls-key-file": str(self.server_key),
                "tls-ca-cert-file": str(self.ca), "tls-auth-clients": "yes" if self.client_cert else "no"}

    def client_options(self) -> dict[str, str | None]:
        return {"ssl_ca_certs": str(self.ca), "ssl_certfile": self.client_cert and str(self.client_cert),
                "ssl_keyfile": self.client_key and str(self.client_key)}


class Fleet:
    live: "weakref.WeakSet[Fleet]" = weakref.WeakSet()  # fleets not yet stopped (a leak check spares their processes)

    def __init__(self, workdir: Path, *, secret: str = "fleet-secret", password: str | None = "fleet-pw",
                 appendonly: bool = False, bind: str = "127.0.0.1", host: str = "127.0.0.1",
                 redis_directives: list[tuple[str, ...]] | None = None, torch: bool = True):
        """``bind``: Redis's listen addresses (space-separated); ``host``: the address workers use;
        ``redis_directives``: more redis.conf lines (``local.start_redis``), e.g. TLS settings;
        ``torch``: the workers' default for the worker spec of the same name (``add_worker``).

        Redis reads its password from a 0600 config file and workers get the URL and the secret by
        environment (``local``), so neither shows on any command line.
        """
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.secret = secret
        self.password = password
        self.appendonly = appendonly
        self.bind = bind
        self.redis_directives = list(redis_directives or [])
        self.torch = torch
        self.port = free_port()
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}{host}:{self.port}/0"
        self.redis_proc: subprocess.Popen | None = None
        self.tls: TlsFiles | None = None
        self.workers: dict[str, subprocess.Popen] = {}
        self._specs: dict[str, dict] = {}
        Fleet.live.add(self)

    def pids(self) -> set[int]:
        """The processes this fleet runs now: Redis and every worker."""
        procs = [self.redis_proc, *self.workers.values()]
        return {p.pid for p in procs if p is not None and p.poll() is None}

    # -- Redis ----------------------------------------------------------------------------------
    def start_redis(self, tls: TlsFiles | None = None) -> None:
        """``tls``: Redis speaks TLS only, and ``url`` becomes ``rediss://`` with the CA (and client certificate);
        a restart of the same fleet's Redis keeps it. Refused while this fleet's Redis runs (``with Fleet(...)``
        started it): a second would take its place here, and the first would outlive the fleet."""
        if self.redis_proc is not None and self.redis_proc.poll() is None:
            raise RuntimeError(f"this fleet's Redis is already running (pid {self.redis_proc.pid}, port {self.port}); "
                               "stop_redis() first to restart it")
        if tls is not None and self.tls is None:
            self.url = with_tls(self.url.replace("redis://", "rediss://", 1), **tls.client_options())
            self.tls = tls
        tls = self.tls
        self.redis_proc = local.start_redis(self.workdir / "redis", port=self.port, password=self.password,
                                            appendonly=self.appendonly, log_file=self.workdir / "redis.log",
                                            bind=self.bind, directives=self.redis_directives,
                                            tls=tls.redis_directives() if tls else None)
        local.wait_for_redis(self.url, self.redis_proc)

    def stop_redis(self) -> None:
        if self.redis_proc is not None:
            stop_process(self.redis_proc)
            self.redis_proc = None

    def client(self) -> redis.Redis:
        return connect_redis(self.url)

    # -- workers --------------------------------------------------------------------------------
    def add_worker(self, name: str, *, slots: int = 1, zone: str | None = None, region: str | None = None,
                   wait: bool = True, torch: bool | None = None, **kwargs) -> subprocess.Popen:
        """``torch=False``: the worker neither imports torch at start nor keeps a warm rank template
        (``NO_TORCH_ENV``): it starts in about a second instead of importing torch twice, and its jobs and
        ranks import torch themselves if they use it. For workers whose jobs use no torch; None: the fleet's."""
        spec = dict(slots=slots, zone=zone, region=region, torch=torch, **kwargs)
        self._specs[name] = spec
        # Each worker gets its own temp root, so a test can list what its jobs left behind.
        env = dict(os.environ, TMPDIR=str(self.worker_tmp(name))) if spec.get("env") is None else \
            dict(spec["env"], TMPDIR=spec["env"].get("TMPDIR", str(self.worker_tmp(name))))
        if not (self.torch if torch is None else torch):
            env.update(NO_TORCH_ENV)
        self.worker_tmp(name).mkdir(parents=True, exist_ok=True)
        proc = local.start_worker(self.url, self.secret, name=name, log_file=self.workdir / f"{name}.log",
                                  **{k: v for k, v in spec.items() if k not in ("torch", "env")}, env=env)
        self.workers[name] = proc
        if wait:
            self.wait_workers([name])
        return proc

    def worker_tmp(self, name: str) -> Path:
        """Worker ``name``'s temp root (its ``TMPDIR``)."""
        return self.workdir / "tmp" / name

    def add_workers(self, specs: dict[str, dict]) -> None:
        """Start every worker of ``{name: spec}`` at once, then wait for all of them to register."""
        for name, spec in specs.items():
            self.add_worker(name, wait=False, **spec)
        self.wait_workers(list(specs))

    def restart_worker(self, name: str, wait: bool = True) -> subprocess.Popen:
        self.stop_worker(name)
        return self.add_worker(name, wait=wait, **self._specs[name])

    def kill_worker(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill a worker's main process (its pool processes exit when their parent does)."""
        proc = self.workers[name]
        proc.send_signal(sig)
        proc.wait(30)

    def connections(self, name: str) -> list[dict]:
        """The ``CLIENT LIST`` entries of worker ``name``'s processes (matched by their local ports)."""
        import psutil

        ports = set()
        root = psutil.Process(self.workers[name].pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                ports |= {c.laddr.port for c in proc.net_connections(kind="tcp") if c.raddr}
            except psutil.NoSuchProcess:
                pass
        client = self.client()
        try:
            return [c for c in client.client_list() if int(c["addr"].rsplit(":", 1)[1]) in ports]
        finally:
            client.close()

    def stop_worker(self, name: str) -> None:
        proc = self.workers.pop(name, None)
        if proc is not None:
            stop_process(proc, grace=15)

    def wait_workers(self, names, timeout: float = 60.0) -> None:
        client = self.client()
        registry = Registry(client)
        deadline = Deadline(timeout)
        try:
            while True:
                live = {w.id for w in registry.snapshot()}
                if set(names) <= live:
                    return
                for n in names:
                    p = self.workers.get(n)
                    if p is not None and p.poll() is not None:
                        log = (self.workdir / f"{n}.log").read_text(errors="replace")[-3000:]
                        raise RuntimeError(f"worker {n} exited with {p.returncode}:\n{log}")
                if deadline.expired():
                    raise TimeoutError(f"workers {sorted(set(names) - live)} did not register in {timeout}s")
                time.sleep(0.05)
        finally:
            client.close()

    def connect(self):
        import gpulayer

        return gpulayer.init(self.url, secret=self.secret)

    # -- lifetime -------------------------------------------------------------------------------
    def stop_workers(self, grace: float = 15.0) -> None:
        """Stop every worker: SIGTERM to all at once, SIGKILL to any left after ``grace`` s."""
        stop(list(self.workers.values()), grace)
        self.workers.clear()

    def stop(self) -> None:
        root = self._machine_root()
        self.stop_workers()
        self.stop_redis()
        # Its Redis (in the test's workdir) is gone for good: so is what its workers kept in the cluster's
        # root on this machine (objects of kept results, unpacked code), which no other cluster would sweep.
        local.remove_cluster_root(root)
        Fleet.live.discard(self)

    def _machine_root(self) -> Path | None:
        if self.redis_proc is None or self.redis_proc.poll() is not None:
            return None
        client = connect_redis(self.url, socket_connect_timeout=2, socket_timeout=2)
        try:
            return local.cluster_root(client)
        except redis.RedisError:
            return None
        finally:
            client.close()

    def __enter__(self) -> Fleet:
        self.start_redis()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
