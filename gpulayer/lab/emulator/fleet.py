"""The parent side of an emulated fleet: which workers exist, which process carries them, start and stop."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import redis

from ...deadline import Deadline
from ...models import WorkerInfo
from ...procs.stop import stop
from ...store.connection import connect_redis
from ...store.registry import Registry


def emulated_workers(n: int, *, slots: int = 8, zones: int = 30, regions: int = 10, gpus: int = 8,
                     gpu_every: int = 5, prefix: str = "emu", pid: int = 0,
                     address: str = "127.0.0.1") -> list[WorkerInfo]:
    """``n`` worker records: zone ``i % zones`` (regions spread evenly over zones), every
    ``gpu_every``-th worker with ``gpus`` GPUs, one host per worker."""
    per_region = max(1, zones // max(1, regions))
    out = []
    for i in range(n):
        z = i % zones
        g = gpus if gpu_every and i % gpu_every == 0 else 0
        out.append(WorkerInfo(id=f"{prefix}-{i:05d}", hostname=f"{prefix}-host-{i:05d}", address=address,
                              zone=f"{prefix}-zone-{z:02d}", region=f"{prefix}-region-{min(z // per_region, regions - 1)}",
                              gpus=g, gpu_names=("emulated GPU",) * g, slots=slots, pid=pid, started_at=time.time()))
    return out


class EmulatedFleet:
    """``workers`` emulated workers on the Redis at ``url``, carried by ``processes`` emulator processes.

    Every process is started here and stopped here, by pid; its workers leave the
    registry when it stops.
    """

    def __init__(self, url: str, secret: str, *, workers: int = 1000, processes: int = 2, slots: int = 8,
                 zones: int = 30, regions: int = 10, gpus: int = 8, gpu_every: int = 5, prefix: str = "emu",
                 heartbeat_interval: float = 1.0, log_dir: Path | None = None):
        self.url, self.secret = url, secret
        self.n, self.processes = workers, max(1, min(processes, workers))
        self.spec = dict(slots=slots, zones=zones, regions=regions, gpus=gpus, gpu_every=gpu_every, prefix=prefix)
        self.heartbeat_interval = heartbeat_interval
        self.log_dir = Path(log_dir) if log_dir else None
        self.procs: list[subprocess.Popen] = []
        self._logs: list = []

    @property
    def ids(self) -> list[str]:
        return [w.id for w in emulated_workers(self.n, **self.spec)]

    def start(self) -> EmulatedFleet:
        step = -(-self.n // self.processes)
        for k in range(self.processes):
            lo, hi = k * step, min(self.n, (k + 1) * step)
            if lo >= hi:
                break
            config = dict(url=self.url, secret=self.secret, n=self.n, lo=lo, hi=hi, spec=self.spec,
                          heartbeat_interval=self.heartbeat_interval)
            out = subprocess.DEVNULL
            if self.log_dir:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                out = open(self.log_dir / f"emulator-{k}.log", "ab")
                self._logs.append(out)
            self.procs.append(subprocess.Popen([sys.executable, "-m", "gpulayer.lab.emulator.process", json.dumps(config)],
                                               stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        return self

    def wait_registered(self, timeout: float = 120.0) -> None:
        """Until every emulated worker is live in the registry (or a process died: then say so)."""
        client = connect_redis(self.url)
        want = set(self.ids)
        deadline = Deadline(timeout)
        try:
            reg = Registry(client)
            while True:
                if want <= reg.live_ids():
                    return
                dead = [p.pid for p in self.procs if p.poll() is not None]
                if dead:
                    raise RuntimeError(f"emulator processes {dead} exited before their workers registered"
                                       + (f"; see {self.log_dir}" if self.log_dir else ""))
                if deadline.expired():
                    raise TimeoutError(f"{len(want - reg.live_ids())} emulated workers did not register in {timeout}s")
                time.sleep(0.1)
        finally:
            client.close()

    def stop(self, grace: float = 15.0) -> None:
        stop(self.procs, grace)
        self.procs = []
        for f in self._logs:
            f.close()
        self._logs = []

    def __enter__(self) -> EmulatedFleet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
