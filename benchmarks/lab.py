"""A fleet on simulated machines: a shaped ``gpulayer.lab.netns`` lab, Redis on its bridge, one worker per machine.

>>> with lab_fleet(Path(tmp), "2r x 3z x 5m", slots=2, torch=False) as (lab, fleet):
...     fleet.connect()                       # this process is a client in the root namespace

Each machine runs a real ``gpulayer worker`` in its namespace (``gpulayer.lab.fleet.Fleet``) with the
machine's name, ``--zone``, ``--region`` and ``--advertise-addr``. ``torch=False`` starts workers
without the torch preload and without the warm rank template (``GPULAYER_PRELOAD=``,
``GPULAYER_WARM_RANKS=0``): small enough for 30 machines running tiny jobs; jobs that import
torch then import it once per pool process. ``torch=True`` preloads torch and ``gpulayer.trainer``
(``GPULAYER_PRELOAD=torch,gpulayer.trainer``) and keeps the warm rank template. ``restart(torch=...)`` swaps every worker.

Also a command, to keep a fleet up by hand (Ctrl-C stops it and deletes the lab)::

    python benchmarks/lab.py --topology "2r x 3z x 5m" [--slots 2] [--no-torch] [--no-shaping]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import psutil
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import redis_on_its_own_machine  # noqa: E402  (same folder)
from gpulayer.lab.netns import NetnsLab, Shaping, Topology  # noqa: E402
from gpulayer.lab.fleet import Fleet  # noqa: E402

NO_TORCH_ENV = {"GPULAYER_PRELOAD": "", "GPULAYER_WARM_RANKS": "0"}
# Torch workers also preload the Trainer, so a sweep's pool processes fork with it instead of each importing it.
TORCH_ENV = {"GPULAYER_PRELOAD": "torch,gpulayer.trainer"}


class LabFleet:
    """A started lab and its fleet; ``specs()`` are the workers' ``Fleet.add_worker`` arguments."""

    def __init__(self, lab: NetnsLab, fleet: Fleet, slots: int):
        self.lab, self.fleet, self.slots = lab, fleet, slots
        self.torch = True

    def specs(self, torch: bool, cuda: str = "off") -> dict[str, dict]:
        env = dict(os.environ, PYTHONPATH=str(ROOT), **(TORCH_ENV if torch else NO_TORCH_ENV))
        return {m.name: dict(slots=self.slots, zone=m.zone, region=m.region, prefix=self.lab.prefix(m.index),
                             advertise_addr=m.address, env=env, cuda=cuda) for m in self.lab.machines}

    def start_workers(self, torch: bool = True, timeout: float = 600, wave: int = 5,
                      machines: int | None = None) -> float:
        """Start one worker on each machine (the first ``machines`` only, if given), ``wave`` at a time
        (30 at once drown a 2-core host, and a registry read times out), each wave waited for; returns
        the seconds it took."""
        self.torch = torch
        t = time.monotonic()
        specs = list(self.specs(torch).items())[:machines]
        for k in range(0, len(specs), wave):
            names = []
            for name, spec in specs[k:k + wave]:
                self.fleet.add_worker(name, wait=False, **spec)
                names.append(name)
            self.wait_workers(names, timeout)
        return time.monotonic() - t

    def wait_workers(self, names: list[str], timeout: float = 600) -> None:
        """``Fleet.wait_workers``, tried again when a registry read times out under load."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.fleet.wait_workers(names, timeout=max(1.0, deadline - time.monotonic()))
            except redis.exceptions.TimeoutError:
                if time.monotonic() > deadline:
                    raise

    def stop_workers(self) -> None:
        self.fleet.stop_workers()

    def restart(self, torch: bool, machines: int | None = None) -> float:
        self.stop_workers()
        return self.start_workers(torch, machines=machines)

    def memory(self) -> dict[str, float]:
        """MiB per machine: RSS and USS (memory no other process shares) summed over each worker's process tree."""
        rss = uss = 0
        procs = [p for p in self.fleet.workers.values() if p.poll() is None]
        for proc in procs:
            try:
                root = psutil.Process(proc.pid)
                for p in [root, *root.children(recursive=True)]:
                    info = p.memory_full_info()
                    rss += info.rss
                    uss += info.uss
            except psutil.NoSuchProcess:
                pass
        n = max(1, len(procs))
        return {"rss_mib_per_machine": rss / n / 2**20, "uss_mib_per_machine": uss / n / 2**20, "machines": len(procs)}


@contextmanager
def lab_fleet(workdir: Path, topology: Topology | str, *, slots: int = 2, shaping: Shaping | None = Shaping(),
              torch: bool = True, start: bool = True) -> Iterator[LabFleet]:
    """A shaped lab, Redis on its bridge (and loopback) and, with ``start``, one worker per machine."""
    with NetnsLab(topology, shaping) as lab:
        fleet = Fleet(workdir, bind=f"127.0.0.1 {lab.host_address}", host=lab.host_address)
        with fleet:
            redis_on_its_own_machine(fleet)
            lf = LabFleet(lab, fleet, slots)
            if start:
                lf.start_workers(torch)
            try:
                yield lf
            finally:
                lf.stop_workers()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default="2r x 3z x 5m")
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--no-shaping", action="store_true")
    a = p.parse_args()
    from common import unwind_on_signals  # same folder

    unwind_on_signals()
    with tempfile.TemporaryDirectory(prefix="gpulayer-lab-") as tmp, \
            lab_fleet(Path(tmp), a.topology, slots=a.slots, torch=not a.no_torch,
                      shaping=None if a.no_shaping else Shaping()) as lf:
        print(f"broker URL: {lf.fleet.url}\nsecret    : {lf.fleet.secret}\nlab tag   : {lf.lab.names.tag}")
        for m in lf.lab.machines:
            print(f"  {m.name:<10} {m.zone:<6} {m.region:<4} {m.address:<15} {' '.join(lf.lab.prefix(m.index))}")
        print(f"memory: {lf.memory()}\nCtrl-C to stop", flush=True)
        try:
            while all(w.poll() is None for w in lf.fleet.workers.values()):
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
