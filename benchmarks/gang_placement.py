"""Placement latency of a gang that fits: ``distributed(...)`` called -> placement known in the client.

One Redis on a free loopback port and 2 ``gpulayer worker`` processes with 2 slots
each, in one zone (``gpulayer.lab.fleet.Fleet``). Each run submits one 2 x 2 gang whose
function returns at once, times the ``distributed(...)`` call until ``job.placement``
returns, then waits for the result and for every slot to be free again, so every
gang is placed on a free fleet. Also run, for a second figure: the time until a
gang that had to wait is placed once the gang holding the slots gives them back.

    python benchmarks/gang_placement.py [--runs 20]

To compare two versions of the code, run it twice with ``PYTHONPATH`` pointing at each
checkout (the workers inherit it): the figures are medians over ``--runs``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import unwind_on_signals, write_results  # same folder

NODES, PROCS = 2, 2
FREE_TIMEOUT = 30.0


def returns_at_once():
    return 1


def holds_for(seconds: float):
    import time as _t

    _t.sleep(seconds)
    return 1


def wait_slots_free(store) -> None:
    deadline = time.monotonic() + FREE_TIMEOUT
    while store.held():
        if time.monotonic() > deadline:
            raise TimeoutError(f"slots still held {FREE_TIMEOUT:.0f}s after the job: {store.held()}")
        time.sleep(0.01)


def placed_after_submit(store) -> float:
    from gpulayer import distributed

    t0 = time.perf_counter()
    job = distributed(returns_at_once, nodes=NODES, procs_per_node=PROCS)
    job.placement  # noqa: B018 (returns once the gang is placed)
    elapsed = time.perf_counter() - t0
    job.get(timeout=120)
    wait_slots_free(store)
    return elapsed


def placed_after_release(store) -> float:
    """A gang waits behind one holding every slot; seconds from the holder's slots freed to the waiter placed."""
    from gpulayer import distributed

    hold = distributed(holds_for, 1.0, nodes=NODES, procs_per_node=PROCS)
    hold.placement  # noqa: B018
    waiter = distributed(returns_at_once, nodes=NODES, procs_per_node=PROCS, timeout=120)
    while store.record(waiter.id)["reason"] == "waiting for the coordinator":
        time.sleep(0.005)
    while store.held():  # the holder's slots go back
        time.sleep(0.001)
    freed = time.perf_counter()
    waiter.placement  # noqa: B018
    elapsed = time.perf_counter() - freed
    hold.get(timeout=120)
    waiter.get(timeout=120)
    wait_slots_free(store)
    return elapsed


def benchmark(runs: int) -> list[str]:
    from gpulayer.app import redis_client
    from gpulayer.store.gangs import GangStore
    from gpulayer.lab.fleet import Fleet

    import gpulayer

    lines: list[str] = []

    def out(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    out(f"# gang_placement.py  code from {Path(gpulayer.__file__).parent}")
    out(f"# {NODES} workers x {PROCS} slots, gangs of {NODES} x {PROCS} whose function returns at once; {runs} runs "
        "(+1 warm-up)")
    workdir = Path(tempfile.mkdtemp(prefix="gl-placement-"))
    fleet = Fleet(workdir)
    submit, release = [], []
    try:
        fleet.start_redis()
        for i in range(NODES):
            fleet.add_worker(f"place-{i + 1}", slots=PROCS, zone="bench-1a", wait=False, tie_to_parent=True)
        fleet.wait_workers(list(fleet.workers), timeout=90)
        fleet.connect()
        store = GangStore(redis_client())
        placed_after_submit(store)  # warm-up
        for r in range(runs):
            submit.append(placed_after_submit(store))
            out(f"{r + 1:>3}  submit->placed {submit[-1] * 1e3:8.1f} ms")
        for r in range(max(3, runs // 4)):
            release.append(placed_after_release(store))
            out(f"{r + 1:>3}  released->placed {release[-1] * 1e3:8.1f} ms")
    finally:
        fleet.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    out()
    out(f"median submit->placed: {statistics.median(submit) * 1e3:.1f} ms (min {min(submit) * 1e3:.1f}, "
        f"max {max(submit) * 1e3:.1f}) over {len(submit)} gangs")
    out(f"median slots released->waiting gang placed: {statistics.median(release) * 1e3:.1f} ms over "
        f"{len(release)} gangs")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="gangs measured (default 20)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    unwind_on_signals()
    lines = benchmark(args.runs)
    print(f"\nwritten to {write_results(lines, 'gang_placement.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
