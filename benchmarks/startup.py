"""Startup latency of a tiny distributed job: the direct launcher (warm and fresh ranks) against torchrun.

One run starts one Redis on a free loopback port and 2 ``gpulayer worker``
processes with 2 slots each, in one zone (``gpulayer.lab.fleet.Fleet``). The job
is 2 workers x 2 processes: import torch, ``gpulayer.init_process_group("gloo")``,
one ``all_reduce`` of a 1-element tensor, return the value (and four
``time.time()`` stamps, for the breakdown). Each run is timed from the
``distributed(...)`` call until ``.get()`` has returned.

Three variants: ``direct`` (ranks forked from each worker's warm template, the
default), ``torchrun``, and ``direct-fresh`` (``warm=False``: fresh
interpreters). One warm-up job per variant (not counted), then ``--runs`` runs
of each, rotating which variant goes first; between jobs the script waits until
the slot ledger is empty, so every job starts on a free fleet.

    python benchmarks/startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import result_line, unwind_on_signals, write_results  # same folder

VARIANTS = {"direct": ("direct", True), "torchrun": ("torchrun", False), "direct-fresh": ("direct", False)}
LAUNCHERS = tuple(VARIANTS)
NODES, PROCS = 2, 2
GET_TIMEOUT = 180.0
WORKER_READY_TIMEOUT = 90.0
FREE_TIMEOUT = 30.0  # seconds to wait for a finished job's slots to come back


def allreduce_one():
    """The measured job (sent by value). Stamps: entered, torch imported, group ready, all_reduce done."""
    import os
    import time

    t_enter = time.time()
    # This process's start, from /proc (psutil's create_time can be off by up to 1 s: whole-second boot time).
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rpartition(")")[2].split()[19])
    t_start = t_enter - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    import torch
    import torch.distributed as dist

    import gpulayer

    t_torch = time.time()
    gpulayer.init_process_group("gloo")
    t_group = time.time()
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"value": t.item(), "stamps": (t_start, t_enter, t_torch, t_group, time.time())}


# The breakdown: offsets from the distributed(...) call, each the latest over the ranks.
STAGES = ("distributed() returned", "placement known", "ranks started (last)", "function entered (last)",
          "torch imported (last)", "group ready (last)", "all_reduce done (last)", "result in the client")


def run_one(variant: str) -> tuple[float, list[float]]:
    """One job; returns (submission -> result seconds, offsets of STAGES)."""
    from gpulayer import distributed

    launcher, warm = VARIANTS[variant]
    wall0, t0 = time.time(), time.perf_counter()
    job = distributed(allreduce_one, nodes=NODES, procs_per_node=PROCS, launcher=launcher, warm=warm)
    t_submitted = time.time()
    job.placement  # noqa: B018 (returns as soon as the driver thread has placed the gang)
    t_placed = time.time()
    out = job.get(timeout=GET_TIMEOUT)
    elapsed = time.perf_counter() - t0
    t_end = time.time()
    if [r["value"] for r in out] != [float(NODES * PROCS)] * (NODES * PROCS):
        raise AssertionError(f"{variant}: wrong all_reduce results {[r['value'] for r in out]}")
    latest = [max(r["stamps"][i] for r in out) for i in range(5)]
    offsets = [t - wall0 for t in (t_submitted, t_placed, *latest, t_end)]
    return elapsed, offsets


def wait_slots_free(store) -> None:
    deadline = time.monotonic() + FREE_TIMEOUT
    while store.held():
        if time.monotonic() > deadline:
            raise TimeoutError(f"slots still held {FREE_TIMEOUT:.0f}s after the job: {store.held()}")
        time.sleep(0.02)


class Report:
    """Prints a line and keeps it for the results file."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)


def header(out: Report, name: str) -> None:
    import celery
    import torch

    out(f"# {name}  {dt.datetime.now().isoformat(timespec='seconds')}  host {socket.gethostname()}  "
        f"cpus {os.cpu_count()}  load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    out(f"# python {platform.python_version()}, torch {torch.__version__}, celery {celery.__version__}")


def start_fleet(fleet) -> None:
    """Redis + 2 workers x 2 slots in one zone; the caller stops it (``stop_fleet``, by pid) even if this fails."""
    fleet.start_redis()
    for i in range(NODES):
        # tie_to_parent: the workers die with this process even if it is SIGKILLed.
        fleet.add_worker(f"bench-{i + 1}", slots=PROCS, zone="bench-1a", region="bench", wait=False,
                         tie_to_parent=True)
    fleet.wait_workers(list(fleet.workers), timeout=WORKER_READY_TIMEOUT)
    fleet.connect()


def stop_fleet(fleet) -> None:
    """Stop every process by pid; a second Ctrl-C must not cut the cleanup short."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        fleet.stop()
    finally:
        signal.signal(signal.SIGINT, previous)


def benchmark(args: argparse.Namespace) -> list[str]:
    from gpulayer.app import redis_client
    from gpulayer.store.gangs import GangStore
    from gpulayer.lab.fleet import Fleet

    out = Report()
    header(out, "startup.py")
    out(f"# {NODES} workers x {PROCS} slots (one zone), job {NODES} x {PROCS} ranks, gloo; runs {args.runs} per "
        f"variant (+1 warm-up each), rotating the order")
    workdir = Path(tempfile.mkdtemp(prefix="gl-startup-"))
    rows: dict[str, list[tuple[float, list[float]]]] = {name: [] for name in LAUNCHERS}
    fleet = Fleet(workdir)
    try:
        start_fleet(fleet)
        store = GangStore(redis_client())
        for launcher in LAUNCHERS:  # warm-up: page cache, worker imports, the warm templates, the coordinator
            run_one(launcher)
            wait_slots_free(store)
        out()
        out(f"{'run':>3}  {'variant':<12} {'submit->result s':>16} {'placed s':>9}")
        for r in range(args.runs):
            k = r % len(LAUNCHERS)
            order = LAUNCHERS[k:] + LAUNCHERS[:k]
            for launcher in order:
                elapsed, offsets = run_one(launcher)
                wait_slots_free(store)
                rows[launcher].append((elapsed, offsets))
                out(f"{r + 1:>3}  {launcher:<12} {elapsed:>16.3f} {offsets[1]:>9.3f}")
    finally:
        stop_fleet(fleet)
        shutil.rmtree(workdir, ignore_errors=True)

    med = {name: statistics.median(e for e, _ in v) for name, v in rows.items()}
    out()
    out(f"medians over {args.runs} runs: " + ", ".join(f"{name} {med[name]:.3f} s" for name in LAUNCHERS))
    ratio = med["torchrun"] / med["direct"]
    out(f"torchrun / direct (warm): {ratio:.2f}x; direct-fresh / direct (warm): "
        f"{med['direct-fresh'] / med['direct']:.2f}x; torchrun / direct-fresh: "
        f"{med['torchrun'] / med['direct-fresh']:.2f}x")
    out(f"goals: warm direct at least 4x faster than torchrun: {'met' if ratio >= 4 else 'NOT met'}; "
        f"under 1.5 s: {'met' if med['direct'] < 1.5 else 'NOT met'}")
    out()
    out("where the time goes (median offset from the distributed() call, s; rank stamps are the latest rank's):")
    out(f"  {'stage':<27} " + " ".join(f"{name:>12}" for name in LAUNCHERS))
    for i, stage in enumerate(STAGES):
        cells = [statistics.median(o[i] for _, o in rows[name]) for name in LAUNCHERS]
        out(f"  {stage:<27} " + " ".join(f"{c:>12.3f}" for c in cells))
    out()
    for name in LAUNCHERS:  # the same figures for scripts/make_perf_charts.py
        stages = {stage: round(statistics.median(o[i] for _, o in rows[name]), 4) for i, stage in enumerate(STAGES)}
        out(result_line("startup", name, median_s=round(med[name], 4),
                        runs_s=[round(e, 4) for e, _ in rows[name]], stages_s=stages))
    return out.lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="measured runs per variant; medians are quoted (default 5)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    unwind_on_signals()
    lines = benchmark(args)
    print(f"\nwritten to {write_results(lines, 'startup.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
