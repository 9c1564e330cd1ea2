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

Then ``--runs`` warm ``direct`` jobs back to back: each submitted as soon as the
previous one's result is in the client, with no wait, as a sweep of small jobs
does. Each counts whether the slot ledger still held the previous job's slots
when its result arrived (a job's slots are free for the next one by then).

    python benchmarks/startup.py [--runs 5] [--variants direct,torchrun,direct-fresh]
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
GOAL_WARM, GOAL_B2B = 0.3, 0.4  # seconds, call to result: a warm 2 x 2 job alone, and back to back


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


def back_to_back(store, runs: int) -> tuple[list[tuple[float, list[float]]], int]:
    """``runs`` warm direct jobs, each submitted once the previous result is in: (elapsed, offsets) per job,
    and how many results arrived while the slot ledger still held slots."""
    rows, held = [], 0
    for _ in range(runs):
        rows.append(run_one("direct"))
        held += bool(store.held())
    return rows, held


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
        f"variant (+1 warm-up each), rotating the order; then {args.runs} warm direct jobs back to back")
    workdir = Path(tempfile.mkdtemp(prefix="gl-startup-"))
    variants = args.variants
    rows: dict[str, list[tuple[float, list[float]]]] = {name: [] for name in variants}
    fleet = Fleet(workdir)
    try:
        start_fleet(fleet)
        store = GangStore(redis_client())
        for launcher in variants:  # warm-up: page cache, worker imports, the warm templates, the coordinator
            run_one(launcher)
            wait_slots_free(store)
        out()
        out(f"{'run':>3}  {'variant':<12} {'submit->result s':>16} {'placed s':>9}")
        for r in range(args.runs):
            k = r % len(variants)
            order = variants[k:] + variants[:k]
            for launcher in order:
                elapsed, offsets = run_one(launcher)
                wait_slots_free(store)
                rows[launcher].append((elapsed, offsets))
                out(f"{r + 1:>3}  {launcher:<12} {elapsed:>16.3f} {offsets[1]:>9.3f}")
        wait_slots_free(store)
        b2b, held = back_to_back(store, args.runs)
        for r, (elapsed, offsets) in enumerate(b2b):
            out(f"{r + 1:>3}  {'back-to-back':<12} {elapsed:>16.3f} {offsets[1]:>9.3f}")
    finally:
        stop_fleet(fleet)
        shutil.rmtree(workdir, ignore_errors=True)

    med = {name: statistics.median(e for e, _ in v) for name, v in rows.items()}
    b2b_med = statistics.median(e for e, _ in b2b)
    out()
    out(f"medians over {args.runs} runs: " + ", ".join(f"{name} {med[name]:.3f} s" for name in variants))
    out(f"back to back ({args.runs} warm direct jobs, each sent when the previous result was in): median "
        f"{b2b_med:.3f} s; slots still held when a result arrived: {held} of {args.runs}")
    if {"direct", "torchrun", "direct-fresh"} <= set(variants):
        ratio = med["torchrun"] / med["direct"]
        out(f"torchrun / direct (warm): {ratio:.2f}x; direct-fresh / direct (warm): "
            f"{med['direct-fresh'] / med['direct']:.2f}x; torchrun / direct-fresh: "
            f"{med['torchrun'] / med['direct-fresh']:.2f}x")
        out(f"goal: warm direct at least 4x faster than torchrun: {'met' if ratio >= 4 else 'NOT met'}")
    if "direct" in variants:
        out(f"goals: warm direct under {GOAL_WARM} s: {'met' if med['direct'] < GOAL_WARM else 'NOT met'}; "
            f"back to back under {GOAL_B2B} s: {'met' if b2b_med < GOAL_B2B else 'NOT met'}")
    out()
    out("where the time goes (median offset from the distributed() call, s; rank stamps are the latest rank's):")
    columns = [*variants, "back-to-back"]
    table = {**rows, "back-to-back": b2b}
    out(f"  {'stage':<27} " + " ".join(f"{name:>12}" for name in columns))
    for i, stage in enumerate(STAGES):
        cells = [statistics.median(o[i] for _, o in table[name]) for name in columns]
        out(f"  {stage:<27} " + " ".join(f"{c:>12.3f}" for c in cells))
    out()
    for name in variants:  # the same figures for scripts/make_perf_charts.py
        stages = {stage: round(statistics.median(o[i] for _, o in rows[name]), 4) for i, stage in enumerate(STAGES)}
        out(result_line("startup", name, median_s=round(med[name], 4),
                        runs_s=[round(e, 4) for e, _ in rows[name]], stages_s=stages))
    stages = {stage: round(statistics.median(o[i] for _, o in b2b), 4) for i, stage in enumerate(STAGES)}
    # Its own bench name: the charts' start-up figure compares the three launchers.
    out(result_line("startup_back_to_back", "direct", median_s=round(b2b_med, 4),
                    runs_s=[round(e, 4) for e, _ in b2b], slots_held=held, stages_s=stages))
    return out.lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="measured runs per variant; medians are quoted (default 5)")
    p.add_argument("--variants", default=",".join(LAUNCHERS),
                   help=f"comma-separated, from {', '.join(LAUNCHERS)} (default all)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(args.variants) - set(LAUNCHERS))
    if unknown or not args.variants:
        p.error(f"--variants: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(LAUNCHERS)}")
    unwind_on_signals()
    lines = benchmark(args)
    print(f"\nwritten to {write_results(lines, 'startup.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
