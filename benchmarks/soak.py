"""Soak: many jobs while workers are SIGKILLed at random; count what is lost or run twice.

    python benchmarks/soak.py [--jobs 10000] [--workers 3] [--slots 2] [--kill-every 5] [--sleep 0.01,0.05]

One Redis and N workers (real processes, loopback, free ports). Every job
records each start (worker, pid, time) and counts its completions in Redis;
every few seconds a random worker is SIGKILLed and restarted at once. Prints:
jobs lost (no result; goal 0), duplicates (a job run again after it completed,
i.e. after its result was stored; goal 0), re-executions (a kill landed between
a job's last line and its result being stored, so it ran again: delivery is
at least once, completion at most once), time from a kill to the retry of each
job it cut off (median, max), and the workers' memory (main process + pool) at
start and end, and over the longest-lived worker process.
"""

from __future__ import annotations

import argparse
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import write_results  # same folder

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpulayer  # noqa: E402
from gpulayer import submit, submit_batch  # noqa: E402
from gpulayer.lab.fleet import Fleet  # noqa: E402

RUN = f"soak:{int(time.time())}"
KILL_REACH = 0.5  # seconds before a run's recorded start that a kill of its worker may still cut it off


def job(i: int, seconds: float, run: str) -> tuple[int, str]:
    import os
    import time as _t

    r = gpulayer.app.redis_client()
    me = gpulayer.current_worker()
    run_id = f"{me.id}|{os.getpid()}|{_t.time()}"
    r.rpush(f"{run}:start:{i}", run_id)
    _t.sleep(seconds)
    r.rpush(f"{run}:done:{i}", run_id)  # this run reached its last line
    return i, run_id


def wait_results(batch, stall: float) -> tuple[list, float]:
    """Every job's result (None where there is none), once all are in or none arrived for ``stall`` s.

    A lost job never gets a result, so waiting for all of them would never end.
    """
    backend = gpulayer.app.app.backend
    keys = [backend.get_key_for_task(i) for i in batch.ids]
    results: list = [None] * len(keys)
    t0 = last_progress = time.time()
    while True:
        missing = [i for i, r in enumerate(results) if r is None]
        for start in range(0, len(missing), 1000):
            chunk = missing[start:start + 1000]
            for i, raw in zip(chunk, backend.client.mget([keys[i] for i in chunk])):
                if raw is not None:
                    meta = backend.decode_result(raw)
                    results[i] = meta["result"]
                    last_progress = time.time()
        if all(r is not None for r in results):
            return results, time.time() - t0
        if time.time() - last_progress > stall:
            return results, last_progress - t0
        time.sleep(0.5)


def rss_mib(pid: int) -> float:
    """RSS of a worker (main process + pool) in MiB; NaN if it went away during the reading."""
    try:
        proc = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20
    except psutil.NoSuchProcess:
        return float("nan")


def _range(text: str) -> tuple[float, float]:
    """``--sleep MIN,MAX``: two seconds, 0 <= MIN <= MAX."""
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give MIN,MAX in seconds, such as 0.01,0.05") from None
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= MIN <= MAX")
    return low, high


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--kill-every", type=float, default=5.0, help="mean seconds between kills")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sleep", type=_range, default=(0.01, 0.05), metavar="MIN,MAX",
                    help="each job sleeps a random time in this range, in seconds (default 0.01,0.05; 0,0: tiny "
                         "jobs, which the workers run several to a pool process at once)")
    ap.add_argument("--stall", type=float, default=90.0,
                    help="stop waiting when no result arrived for this long (the rest count as lost)")
    a = ap.parse_args()
    low, high = a.sleep
    rng = random.Random(a.seed)
    names = [f"soak-{i + 1}" for i in range(a.workers)]
    out: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        out.append(line)

    with tempfile.TemporaryDirectory(prefix="gpulayer-soak-") as tmp, Fleet(Path(tmp)) as fleet:
        for n in names:
            fleet.add_worker(n, slots=a.slots, zone="z", wait=False)
        fleet.wait_workers(names)
        fleet.connect()
        mem_start = {n: rss_mib(fleet.workers[n].pid) for n in names}
        first_pids = {n: fleet.workers[n].pid for n in names}
        t0 = time.time()
        batch = submit_batch([submit.s(job, i, rng.uniform(low, high), RUN) for i in range(a.jobs)])
        say(f"submitted {a.jobs} jobs in {time.time() - t0:.2f}s to {a.workers} workers x {a.slots} slots")

        kills: list[tuple[str, int, float]] = []
        done = threading.Event()

        def chaos() -> None:
            while not done.wait(rng.uniform(0.5, 1.5) * a.kill_every):
                victim = rng.choice(names)
                pid = fleet.workers[victim].pid
                kills.append((victim, pid, time.time()))
                fleet.kill_worker(victim, signal.SIGKILL)
                fleet.restart_worker(victim, wait=False)

        lives: dict[tuple[str, int], list[tuple[float, float]]] = {}  # (worker, pid) -> [(time, MiB)]

        def sample() -> None:  # every second, each worker's current life (main + pool)
            while not done.wait(1.0):
                for n in names:
                    pid = fleet.workers[n].pid
                    mib = rss_mib(pid)
                    if mib == mib:  # not NaN: the process was there for the whole reading
                        lives.setdefault((n, pid), []).append((time.time(), mib))

        killer = threading.Thread(target=chaos, daemon=True)
        sampler = threading.Thread(target=sample, daemon=True)
        killer.start()
        sampler.start()
        try:
            results, elapsed = wait_results(batch, stall=a.stall)
        finally:
            done.set()
            killer.join()
            sampler.join()
        fleet.wait_workers(names)
        time.sleep(2)
        mem_end = {n: rss_mib(fleet.workers[n].pid) for n in names}

        client = fleet.client()
        failed = [r for r in results if r is not None and not isinstance(r, (list, tuple))]
        lost = sum(1 for r in results if r is None)
        pipe = client.pipeline()
        for i in range(a.jobs):
            pipe.lrange(f"{RUN}:done:{i}", 0, -1)
            pipe.lrange(f"{RUN}:start:{i}", 0, -1)
        raw = pipe.execute()
        dones = [[d.decode() for d in x] for x in raw[0::2]]
        starts = [[s.decode().split("|") for s in x] for x in raw[1::2]]
        # A job whose body finished twice: a duplicate if it was run again after its result was stored (the
        # stored result is the first run's, or the first run was not cut off by a kill); a re-execution if a
        # kill of the first run's worker cut that run off before its result was stored. A kill counts from
        # KILL_REACH before the run's recorded start: the pool process runs on until its SIGKILLed main process
        # has finished exiting (a few ms), and a success it hands back to that process then goes unstored.
        duplicates = reexecuted = 0
        details: list[str] = []
        for r, done, st in zip(results, dones, starts):
            if len(done) < 2 or r is None:
                continue
            w, _, t0 = done[0].split("|")
            rerun_at = min(float(x[2]) for x in st if float(x[2]) > float(t0))
            cut_off = any(v == w and float(t0) - KILL_REACH <= at <= rerun_at for v, _, at in kills)
            if r[1] == done[0] or not cut_off:
                duplicates += 1
                near = [(v, round(at - float(t0), 3)) for v, _, at in kills if abs(at - float(t0)) < 30]
                details.append(f"duplicate: runs started {st}, finished {done}, stored result {r[1]}, "
                               f"kills near the first run (worker, s after its start) {near}")
            else:
                reexecuted += 1
        # For each kill: the jobs running in the killed worker, and when each started again elsewhere.
        retry_delays = []
        for victim, pid, at in kills:
            for st in starts:
                before = [s for s in st if s[0] == victim and float(s[2]) <= at]
                after = [float(s[2]) for s in st if float(s[2]) > at]
                if before and after and len(st) > 1:
                    retry_delays.append(min(after) - at)
        client.close()

        say(f"finished in {elapsed:.1f}s ({a.jobs / elapsed:.0f} jobs/s) with {len(kills)} SIGKILLs")
        say(f"jobs lost (no result):          {lost}  (goal 0)")
        say(f"jobs failed:                    {len(failed)}")
        say(f"duplicates (run after completing): {duplicates}  (goal 0)")
        say(f"re-executions (cut off between last line and stored result): {reexecuted}  "
            "(at-least-once; each result stored once)")
        for line in details:
            say(line)
        if retry_delays:
            say(f"kill -> retry of a cut-off job: median {statistics.median(retry_delays):.2f}s, "
                f"max {max(retry_delays):.2f}s over {len(retry_delays)} jobs")
        else:
            say("kill -> retry: no job was cut off by a kill")
        for n in names:
            note = "" if fleet.workers[n].pid == first_pids[n] else " (restarted: end is its latest life)"
            say(f"worker {n} memory (main + pool): start {mem_start[n]:.0f} MiB, end {mem_end[n]:.0f} MiB{note}")
        if lives:  # kills end most lives within seconds; the longest one shows whether memory grows with jobs
            (n, pid), series = max(lives.items(), key=lambda kv: kv[1][-1][0] - kv[1][0][0])
            born = series[0][0]
            settled = [(t, m) for t, m in series if t - born >= 10]  # start-up (torch import, pool) is over
            if len(settled) >= 2:
                say(f"longest worker life sampled: {n} pid {pid}, {series[-1][0] - born:.0f}s; memory "
                    f"{settled[0][1]:.0f} MiB 10 s in, {max(m for _, m in settled):.0f} MiB at most after, "
                    f"{settled[-1][1]:.0f} MiB at its last sample")

    write_results([f"# python benchmarks/soak.py {' '.join(sys.argv[1:])}", *out], "soak.txt")
    return 0 if lost == 0 and duplicates == 0 and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
