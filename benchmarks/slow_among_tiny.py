"""How long tiny jobs wait to start when a few slow ones run among them.

    python benchmarks/slow_among_tiny.py [--jobs 1000] [--rate 40] [--every 100] [--sleep 2] [--shapes 2x1,1x2]

One Redis (free loopback port) and, for each configuration ``WxS`` in turn, W workers x S slots. The client sends
``--jobs`` jobs at ``--rate`` jobs a second (``submit_batch`` of a tenth of a second's jobs at a time, below what
the slots can run: the slow jobs alone fill ``rate / every x sleep`` slots), one in ``--every`` sleeping
``--sleep`` seconds, the others returning at once. Each job returns when it started; its wait is that minus when
its batch was sent. Printed: the tiny jobs' wait at the median, p99 and max, and how many waited over half a
second (behind a slow one: in a worker's prefetched messages, or in a pool process).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import Report, unwind_on_signals, write_results  # same folder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpulayer.lab.fleet import Fleet  # noqa: E402

STUCK = 0.5  # seconds: a tiny job that waited longer waited behind a slow one


def job(sent: float, sleep: float) -> float:
    """Sleeps ``sleep`` seconds; returns how long after ``sent`` it started."""
    started = time.time()
    if sleep:
        time.sleep(sleep)
    return started - sent


def run(args, shape: tuple[int, int], out: Report) -> None:
    from gpulayer import submit, submit_batch

    workers, slots = shape
    workdir = Path(tempfile.mkdtemp(prefix="gl-slow-"))
    with Fleet(workdir, appendonly=False) as fleet:
        for i in range(workers):
            fleet.add_worker(f"slow-{i + 1}", slots=slots, wait=False, tie_to_parent=True)
        fleet.wait_workers(list(fleet.workers))
        fleet.connect()
        submit_batch([submit.s(job, time.time(), 0.0) for _ in range(100)]).get(timeout=60)  # warm-up
        per_batch = max(1, round(args.rate / 10))
        batches, slow = [], []
        t0 = time.monotonic()
        for first in range(0, args.jobs, per_batch):
            ids = range(first, min(first + per_batch, args.jobs))
            sent = time.time()
            sleeps = [args.sleep if i % args.every == args.every - 1 else 0.0 for i in ids]
            slow += [s > 0 for s in sleeps]
            batches.append(submit_batch([submit.s(job, sent, s) for s in sleeps]))
            time.sleep(max(0.0, t0 + (first + per_batch) / args.rate - time.monotonic()))
        waits = [w for b in batches for w in b.get(timeout=300)]
    shutil.rmtree(workdir, ignore_errors=True)
    tiny = sorted(w for w, s in zip(waits, slow) if not s)
    p99 = tiny[min(len(tiny) - 1, int(0.99 * len(tiny)))]
    stuck = sum(w > STUCK for w in tiny)
    out(f"{workers} x {slots}: {len(tiny)} tiny jobs waited median {1e3 * statistics.median(tiny):.0f} ms, "
        f"p99 {1e3 * p99:.0f} ms, max {1e3 * tiny[-1]:.0f} ms; {stuck} over {STUCK} s  "
        f"(load {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    out(out_line(args, shape, statistics.median(tiny), p99, tiny[-1], stuck))


def out_line(args, shape, median, p99, worst, stuck) -> str:
    from common import result_line

    return result_line("slow_among_tiny", f"{shape[0]}x{shape[1]}", jobs=args.jobs, rate=args.rate,
                       every=args.every, sleep_s=args.sleep, median_ms=round(1e3 * median, 1),
                       p99_ms=round(1e3 * p99, 1), max_ms=round(1e3 * worst, 1), over_half_second=stuck)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--rate", type=float, default=40.0, help="jobs sent per second (default 40)")
    p.add_argument("--every", type=int, default=100, help="one job in this many is slow (default 100)")
    p.add_argument("--sleep", type=float, default=2.0, help="seconds a slow job sleeps (default 2)")
    p.add_argument("--shapes", default="2x1,1x2", help="WxS[,WxS...]: W workers x S slots (default 2x1,1x2)")
    p.add_argument("--output", default="slow_among_tiny.txt",
                   help="results file under benchmarks/results/<date>-<host>/ (default slow_among_tiny.txt)")
    args = p.parse_args(argv)
    shapes = [tuple(int(x) for x in s.lower().split("x")) for s in args.shapes.split(",")]
    unwind_on_signals()
    out = Report("slow_among_tiny")
    out(f"# slow_among_tiny.py  {args.jobs} jobs at {args.rate:g}/s, 1 in {args.every} sleeping {args.sleep:g} s  "
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for shape in shapes:
        run(args, shape, out)
    print(f"\nwritten to {write_results(out.lines, args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
