"""A slot back after a kill: ``revoke(terminate=True)`` of running jobs, and how soon the slot serves again.

    python benchmarks/slot_back.py [--kills 100] [--slots 2] [--how revoke|cancel]

One Redis and one worker with ``--slots`` slots (real processes, loopback, free
port; the worker imports torch at start, as a worker does by default). More
jobs than slots are queued, each recording its start (job, pid, time) in Redis
and then sleeping; ``--kills`` times, once every slot runs a job, the oldest
running job is stopped (``revoke(terminate=True)``, or ``handle.cancel()`` with
``--how cancel``), and the time from the stop to the next job's start on the
freed slot is taken. Prints the median, 90th percentile and max, and what the
stopped jobs' ``get()`` said (``JobStopped``: stopped while running).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import Report, write_results  # same folder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpulayer  # noqa: E402
from gpulayer import JobFailed, submit  # noqa: E402
from gpulayer.lab.fleet import Fleet  # noqa: E402

START_TIMEOUT = 60.0  # seconds a freed slot may take to start the next job before the run is called stuck


def hold(i: int, key: str) -> int:
    """The job: say when it started, then sleep until it is stopped."""
    import os
    import time as _t

    gpulayer.app.redis_client().rpush(key, json.dumps([i, os.getpid(), _t.time()]))
    _t.sleep(3600)
    return i


def run(args: argparse.Namespace) -> list[str]:
    out = Report("slot_back")
    out(f"# slot_back.py  {time.strftime('%Y-%m-%dT%H:%M:%S')}  stop with {args.how}, {args.kills} kills, "
        f"1 worker x {args.slots} slots")
    with tempfile.TemporaryDirectory(prefix="gl-slotback-") as tmp, Fleet(Path(tmp)) as fleet:
        fleet.add_worker("slots-1", slots=args.slots, wait=False, tie_to_parent=True)
        fleet.wait_workers(["slots-1"], timeout=120)
        fleet.connect()
        r = gpulayer.app.redis_client()
        key = f"slotback:{time.time()}"
        handles = [submit.delay(hold, i, key) for i in range(args.kills + args.slots)]
        running: dict[int, tuple[int, float]] = {}  # job index -> (pid, start time)
        gaps: list[float] = []
        messages: list[str] = []
        load0 = os.getloadavg()[0]

        def take_start(timeout: float) -> tuple[int, int, float]:
            item = r.blpop([key], timeout=timeout)
            if item is None:
                raise TimeoutError(f"no job started within {timeout:.0f} s of a kill")
            i, pid, t = json.loads(item[1])
            running[i] = (pid, t)
            return i, pid, t

        while len(running) < args.slots:
            take_start(START_TIMEOUT * 2)
        pids = set()
        for _ in range(args.kills):
            victim = min(running, key=lambda i: running[i][1])
            pids.add(running.pop(victim)[0])
            t_kill = time.time()
            if args.how == "revoke":
                handles[victim].revoke(terminate=True)
            else:
                handles[victim].cancel()
            _, pid, t_start = take_start(START_TIMEOUT)
            pids.add(pid)
            gaps.append(t_start - t_kill)
            if len(messages) < 3:
                try:
                    handles[victim].get(timeout=30)
                    messages.append("no error (the job was not stopped)")
                except JobFailed as err:
                    messages.append(f"{err.type_name}: {err.message}")
        for i in running:
            handles[i].cancel()
        load1 = os.getloadavg()[0]
    gaps_ms = sorted(g * 1000 for g in gaps)
    med = statistics.median(gaps_ms)
    p90 = gaps_ms[int(0.9 * (len(gaps_ms) - 1))]
    out(f"kill -> next job started on the freed slot: median {med:.0f} ms, p90 {p90:.0f} ms, "
        f"max {gaps_ms[-1]:.0f} ms, min {gaps_ms[0]:.0f} ms ({len(gaps)} kills; {len(pids)} pool processes; "
        f"load {load0:.2f} -> {load1:.2f})")
    for m in messages:
        out(f"  a stopped job's get(): {m}")
    out(f"goal: median under 300 ms: {'met' if med < 300 else 'NOT met'}")
    out.result(args.how, median_ms=med, p90_ms=p90, max_ms=gaps_ms[-1], kills=len(gaps))
    return out.lines


def main(argv: list[str] | None = None) -> int:
    from common import unwind_on_signals

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=100, help="running jobs to stop (default 100)")
    p.add_argument("--slots", type=int, default=2, help="the worker's slots (default 2)")
    p.add_argument("--how", choices=("revoke", "cancel"), default="revoke",
                   help="revoke: AsyncResult.revoke(terminate=True); cancel: handle.cancel() (default revoke)")
    args = p.parse_args(argv)
    unwind_on_signals()
    lines = run(args)
    print(f"\nwritten to {write_results(lines, f'slot_back_{args.how}.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
