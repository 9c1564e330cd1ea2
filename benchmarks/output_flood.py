"""Does a job that floods its output slow the fleet's other jobs? Tiny jobs' rate beside a printer, and without.

    python benchmarks/output_flood.py [--jobs 2000] [--lines 100000] [--rounds 5] [--workers 2] [--slots 2]

One Redis (free loopback port) and ``--workers`` x ``--slots`` real workers (without torch). Each round times
``submit_batch`` of ``--jobs`` tiny jobs (``square(i)``) then ``.get()``, three ways, in a rotating order:

- ``none``: the tiny jobs alone;
- ``silent``: beside one job that runs the printer's loop (formatting each line) but writes to a local buffer:
  the same slot and CPU taken as the printer's, none of its output;
- ``printer-not-home`` (with ``--not-home``): the printer, its lines captured and kept but sent to no client;
- ``printer``: beside one job that ``print``s lines in a tight loop (at least ``--lines``, and on until the
  tiny jobs are done), whose output is captured, rate-limited, sent home and printed by this client (sent
  to /dev/null during the timed part, as every mode's stdout and stderr are).

The extra job starts first; the tiny jobs are sent once it runs. Printed: each mode's median jobs/s over the
rounds, and the ratios ``printer / silent`` (what capturing the flood costs the others) and
``printer / none``, of the medians and as the median of each round's own ratio (the three modes of a round
run back to back: on a shared machine whose load drifts, the paired ratio is the steadier figure); the lines
each printer printed and kept; and the CPU a tiny job cost the client, Redis and the workers' processes
(user + system, the extra job's own process left out): steadier than a rate on a busy machine, and where
the flood's cost to the others would show (its lines through Redis, the worker's log, this client).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from common import Report, unwind_on_signals, write_results  # same folder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpulayer.lab.fleet import Fleet  # noqa: E402

MODES = ("none", "silent", "printer")
EXTRA_MODES = ("printer-not-home",)  # --not-home: the printer's lines captured and kept, not sent to this client


def square(x):
    return x * x


def fleet_processes(fleet) -> list:
    """This client, Redis, every worker's main and pool processes."""
    procs = [psutil.Process(), psutil.Process(fleet.redis_proc.pid)]
    for w in fleet.workers.values():
        main = psutil.Process(w.pid)
        procs += [main, *main.children(recursive=True)]
    return procs


def cpu_seconds(procs, leave_out: int | None) -> dict[int, float]:
    out = {}
    for p in procs:
        if p.pid == leave_out:
            continue
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def loop(lines: int, stop_key: str, started_key: str, silent: bool) -> int:
    """Print (or format into a buffer) at least ``lines`` lines, and on until ``stop_key`` is set."""
    import time

    from gpulayer.app import redis_client

    r = redis_client()
    r.set(started_key, os.getpid(), ex=600)
    sink = io.StringIO() if silent else None
    n, stop, next_look = 0, False, 0.0
    # The stop key is read every 50 ms, not every so many lines: both loops then keep a core busy alike (read
    # per 1,000 lines, the silent loop, 10x faster a line, waited on Redis 3,000 times a second).
    while n < lines or not stop:
        if time.monotonic() >= next_look:
            stop, next_look = bool(r.exists(stop_key)), time.monotonic() + 0.05
        for _ in range(100):
            if sink is None:
                print(f"flood line {n} of a job that prints in a tight loop")
            else:
                sink.write(f"flood line {n} of a job that prints in a tight loop\n")
            n += 1
        if sink is not None and sink.tell() > 1 << 20:
            sink.seek(0)
            sink.truncate()
    r.close()
    return n


def one_round(mode: str, args, r, round_no: int, fleet) -> tuple[float, float, int | None, int | None]:
    from gpulayer import submit, submit_batch
    from gpulayer.store import keys
    from gpulayer.output import tail, watch
    from gpulayer.tasks.submit import OUTPUT_HEADER

    stop_key, started_key = f"bench:flood:stop:{round_no}:{mode}", f"bench:flood:started:{round_no}:{mode}"
    extra, extra_pid = None, None
    if mode == "printer-not-home":  # an empty output id: kept in its tail, sent to no client
        extra = submit.apply_async((loop, args.lines, stop_key, started_key, False), headers={OUTPUT_HEADER: ""})
    elif mode != "none":
        extra = submit.delay(loop, args.lines, stop_key, started_key, mode == "silent")
        deadline = time.monotonic() + 60
        while not r.exists(started_key):
            if time.monotonic() > deadline:
                raise SystemExit("the extra job did not start within 60 s")
            time.sleep(0.01)
        extra_pid = int(r.get(started_key))
    procs = fleet_processes(fleet)
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
        before = cpu_seconds(procs, extra_pid)
        t0 = time.perf_counter()
        values = submit_batch([submit.s(square, i) for i in range(args.jobs)]).get(timeout=300, progress=False)
        elapsed = time.perf_counter() - t0
        after = cpu_seconds(procs, extra_pid)
        used = sum(after[pid] - before[pid] for pid in after if pid in before)
        assert values[-1] == (args.jobs - 1) ** 2
        printed = kept = None
        if extra is not None:
            r.set(stop_key, 1, ex=600)
            printed = extra.get(timeout=300)
            kept = len(tail.entries(r, extra.id)) if mode.startswith("printer") else None
            r.delete(keys.job_output(extra.id))
            watch.sync()  # the lines still on their way are printed here, to /dev/null
    return args.jobs / elapsed, used / args.jobs * 1e6, printed, kept


def main() -> int:
    unwind_on_signals()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--lines", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--not-home", action="store_true",
                   help="a fourth mode: the printer's lines captured and kept, but sent to no client")
    p.add_argument("--output", default="output_flood.txt")
    args = p.parse_args()
    out = Report("output_flood")
    from gpulayer import submit, submit_batch

    with Fleet(Path(tempfile.mkdtemp(prefix="gl-flood-")), appendonly=False, torch=False) as fleet:
        for i in range(args.workers):
            fleet.add_worker(f"flood-{i + 1}", slots=args.slots, wait=False, tie_to_parent=True)
        fleet.wait_workers(list(fleet.workers))
        fleet.connect()
        r = fleet.client()
        submit_batch([submit.s(square, i) for i in range(500)]).get(timeout=120, progress=False)  # warm-up
        out(f"{args.jobs} tiny jobs (submit_batch) on {args.workers} x {args.slots} slots, {os.cpu_count()} cores; "
            f"printer: >= {args.lines} lines in a tight loop; {args.rounds} rounds")
        modes = MODES + (EXTRA_MODES if args.not_home else ())
        rates = {m: [] for m in modes}
        cpus = {m: [] for m in modes}
        for rnd in range(args.rounds):
            order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
            for mode in order:
                rate, cpu_us, printed, kept = one_round(mode, args, r, rnd, fleet)
                rates[mode].append(rate)
                cpus[mode].append(cpu_us)
                more = f", printed {printed} lines, {kept} kept in its tail" if printed is not None and kept else \
                    (f", formatted {printed} lines" if printed is not None else "")
                out(f"round {rnd + 1} {mode:>16}: {rate:7.0f} jobs/s, {cpu_us:4.0f} us CPU a job{more}")
        med = {m: statistics.median(v) for m, v in rates.items()}
        paired_silent = statistics.median(p / s for p, s in zip(rates["printer"], rates["silent"]))
        paired_none = statistics.median(p / n for p, n in zip(rates["printer"], rates["none"]))
        out("")
        cpu_med = {m: statistics.median(v) for m, v in cpus.items()}
        for m in modes:
            out(f"median {m:>16}: {med[m]:7.0f} jobs/s, {cpu_med[m]:4.0f} us CPU a tiny job (client, Redis, "
                "workers; the extra job's process left out)")
        out(f"printer / silent: {med['printer'] / med['silent']:.3f} of the medians, {paired_silent:.3f} median of "
            "the rounds' own   (what capturing a flood costs the other jobs)")
        out(f"printer / none:   {med['printer'] / med['none']:.3f} of the medians, {paired_none:.3f} median of the "
            "rounds' own   (a busy job beside them at all, printing)")
        out.result("tiny_beside_printer", jobs=args.jobs, lines=args.lines, rounds=args.rounds,
                   none_jobs_s=med["none"], silent_jobs_s=med["silent"], printer_jobs_s=med["printer"],
                   printer_over_silent=med["printer"] / med["silent"], printer_over_none=med["printer"] / med["none"],
                   paired_printer_over_silent=paired_silent, paired_printer_over_none=paired_none,
                   cpu_us_per_job={m: cpu_med[m] for m in modes},
                   **({"not_home_jobs_s": med["printer-not-home"]} if args.not_home else {}))
    path = write_results(out.lines, args.output)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
