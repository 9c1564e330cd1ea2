"""CPU per tiny job, by process: the client, Redis, the worker's main process, its pool processes.

    python benchmarks/cpu_per_job.py [--jobs 2000] [--rounds 3] [--workers 1] [--slots 2] [--way batch,delay]
                                     [--profile-client] [--spy SECONDS]

One Redis (free loopback port) and real workers (without torch). Each round runs ``--jobs`` calls of
``square(i)`` (``submit_batch`` then ``.get()``, or one ``submit.delay`` each then ``h.get()`` on each) and
charges every process's CPU time (user + system, from ``/proc``) over the round to its role; medians over the
rounds, in microseconds per job. A process's system time is its system calls: for the worker's processes
mostly the pipes between the main process and its pool processes (the IPC) and their sockets to Redis.

``--profile-client``: one more round of each way under cProfile; the functions with the most own time.
``--spy S``: one more round of each way, ``py-spy record --gil`` (on PATH, or ``PY_SPY``) sampling every
worker process for up to S seconds while it runs Python; the functions with the most samples, by role.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from common import write_results  # same folder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpulayer.lab.fleet import Fleet  # noqa: E402

ROLES = ("client", "redis", "worker main", "pool processes")


def square(x):
    return x * x


def run_way(way: str, n: int) -> None:
    from gpulayer import submit, submit_batch

    if way == "batch":
        results = submit_batch([submit.s(square, i) for i in range(n)]).get(timeout=300)
    else:
        results = [h.get(timeout=300) for h in [submit.delay(square, i) for i in range(n)]]
    if results != [i * i for i in range(n)]:
        raise AssertionError(f"{way}: wrong results (first few: {results[:5]})")


def processes(fleet: Fleet) -> dict[str, list[psutil.Process]]:
    mains = [psutil.Process(p.pid) for p in fleet.workers.values()]
    return {"client": [psutil.Process()], "redis": [psutil.Process(fleet.redis_proc.pid)], "worker main": mains,
            "pool processes": [c for m in mains for c in m.children(recursive=True)]}


def cpu(procs: dict[str, list[psutil.Process]]) -> dict[str, tuple[float, float]]:
    """(user, system) seconds so far, by role."""
    out = {}
    for role, group in procs.items():
        user = system = 0.0
        for p in group:
            t = p.cpu_times()
            user, system = user + t.user, system + t.system
        out[role] = (user, system)
    return out


def profile_client(way: str, n: int, out) -> None:
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.runcall(run_way, way, n)
    took = time.perf_counter() - t0
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(22)
    out(f"# cProfile of the client, {way}, {n} jobs, {took:.2f} s under the profiler (own time, top 22):")
    keep = False
    for line in text.getvalue().splitlines():
        keep = keep or line.lstrip().startswith("ncalls")
        if keep and line.strip():
            out("    " + line.rstrip()[:150])
    stats.sort_stats("cumulative")
    text.seek(0)
    text.truncate()
    stats.print_stats(30)
    out(f"# same, cumulative time (top 30):")
    keep = False
    for line in text.getvalue().splitlines():
        keep = keep or line.lstrip().startswith("ncalls")
        if keep and line.strip():
            out("    " + line.rstrip()[:150])


def spy(fleet: Fleet, way: str, n: int, seconds: float, out) -> None:
    """py-spy on every worker process while a round runs; top own-time functions by role."""
    exe = os.environ.get("PY_SPY") or shutil.which("py-spy")
    if not exe:
        out("# py-spy not found (PATH or PY_SPY): worker profiles skipped")
        return
    folder = Path(tempfile.mkdtemp(prefix="gl-spy-"))
    procs = processes(fleet)
    spies = []
    try:
        for role in ("worker main", "pool processes"):
            for p in procs[role]:
                raw = folder / f"{role.replace(' ', '_')}-{p.pid}.txt"
                spies.append((role, raw, subprocess.Popen(
                    [exe, "record", "--pid", str(p.pid), "--rate", "500", "--duration", str(int(seconds)),
                     "--format", "raw", "--output", str(raw), "--nonblocking", "--gil"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        time.sleep(1.0)  # py-spy attaches
        run_way(way, n)
    finally:
        for _, _, proc in spies:
            proc.send_signal(2)  # SIGINT: py-spy writes what it sampled so far
        for _, _, proc in spies:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    for role in ("worker main", "pool processes"):
        own: collections.Counter = collections.Counter()
        inclusive: collections.Counter = collections.Counter()
        total = 0
        for r, raw, _ in spies:
            if r != role or not raw.exists():
                continue
            for line in raw.read_text().splitlines():
                stack, _, count = line.rpartition(" ")
                if not stack or not count.isdigit():
                    continue
                own[stack.split(";")[-1]] += int(count)
                for frame in set(stack.split(";")):
                    inclusive[frame] += int(count)
                total += int(count)
        out(f"# py-spy --gil, {role}, {way}: {total} samples holding the GIL at 500/s (a system call that releases "
            f"it, such as a pipe's or a socket's write, is not among them); own samples, top 15:")
        for frame, count in own.most_common(15):
            out(f"    {100 * count / max(total, 1):5.1f}%  {frame[:140]}")
        out(f"# the same samples, inclusive (the function or anything it called), top 60:")
        for frame, count in inclusive.most_common(60):
            out(f"    {100 * count / max(total, 1):5.1f}%  {frame[:140]}")
    shutil.rmtree(folder, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--way", default="batch,delay", help="batch, delay or both (batch,delay)")
    p.add_argument("--profile-client", action="store_true")
    p.add_argument("--spy", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--output", default="cpu_per_job.txt")
    args = p.parse_args(argv)
    ways = [w.strip() for w in args.way.split(",") if w.strip()]
    if not ways or set(ways) - {"batch", "delay"}:
        p.error("--way: batch, delay or batch,delay")
    lines: list[str] = []

    def out(s=""):
        print(s, flush=True)
        lines.append(s)

    out(f"# cpu_per_job.py  {args.jobs} jobs x {args.rounds} rounds, {args.workers} worker(s) x {args.slots} slot(s)"
        f"  load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with Fleet(Path(tempfile.mkdtemp(prefix="gl-cpu-")), appendonly=False, torch=False) as fleet:
        for i in range(args.workers):
            fleet.add_worker(f"cpu-{i + 1}", slots=args.slots, wait=False, tie_to_parent=True)
        fleet.wait_workers(list(fleet.workers))
        fleet.connect()
        for way in ways:
            run_way(way, 200)  # warm-up: connections, caches, every pool process
        procs = processes(fleet)
        for way in ways:
            per: dict[str, list[tuple[float, float]]] = {role: [] for role in ROLES}
            walls = []
            for _ in range(args.rounds):
                before, t0 = cpu(procs), time.perf_counter()
                run_way(way, args.jobs)
                walls.append(time.perf_counter() - t0)
                after = cpu(procs)
                for role in ROLES:
                    per[role].append(tuple(1e6 * (a - b) / args.jobs for a, b in zip(after[role], before[role])))
            wall = statistics.median(walls)
            out()
            out(f"## {way}: median {args.jobs / wall:.0f} jobs/s ({wall:.2f} s a round), load "
                f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            out(f"  {'process':<16}{'user us/job':>12}{'system us/job':>15}{'total us/job':>14}")
            total = 0.0
            for role in ROLES:
                u = statistics.median(x for x, _ in per[role])
                s = statistics.median(y for _, y in per[role])
                total += u + s
                out(f"  {role:<16}{u:>12.0f}{s:>15.0f}{u + s:>14.0f}")
            out(f"  {'all':<16}{'':>12}{'':>15}{total:>14.0f}")
        for way in ways:
            if args.profile_client:
                out()
                profile_client(way, args.jobs, out)
            if args.spy:
                out()
                spy(fleet, way, args.jobs, args.spy, out)
    print(f"\nwritten to {write_results(lines, args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
