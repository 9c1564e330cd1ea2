"""What waiting for a replica costs (``durability``, README "Sentinel"): "local" vs "replicated", side by side.

    python benchmarks/durability_cost.py [--rounds 3] [--delays 200] [--chunks 5] [--jobs 2000]

One Sentinel group on loopback (a primary, one replica, three sentinels: ``gpulayer.lab.sentinel_fleet``) and
one worker (2 slots, no torch). Each round runs both modes in turn, the order swapped every round; in each,
the client and the worker use that mode (``GPULAYER_DURABILITY``):

- ``delay``: ``submit.delay`` of a tiny job, one call at a time (the worker runs them meanwhile);
- ``chunk``: ``submit_batch`` of 1,000 jobs in one chunk (one pipeline, and in "replicated" one WAIT);
- ``finished job``: ``submit_batch`` of ``--jobs`` tiny jobs through the worker, until every result is read:
  wall time per job (its take, result, ack and in "replicated" the WAITs after them).

Figures are medians over every call (delay, chunk) or over the rounds (finished job). The replica is on the
same machine, so a WAIT costs a loopback round trip and the replica's work: across machines, add the network's
round trip to each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import Report, unwind_on_signals, write_results  # same folder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpulayer import submit, submit_batch  # noqa: E402
from gpulayer.config import load_settings  # noqa: E402
from gpulayer.lab.sentinel_fleet import SentinelFleet  # noqa: E402
from gpulayer.session import connect  # noqa: E402

MODES = ("local", "replicated")


def noop(x):
    return x


def one_mode(fleet: SentinelFleet, mode: str, args, seen: dict) -> None:
    env = dict(os.environ, GPULAYER_DURABILITY=mode)
    fleet.add_workers({f"d-{mode}": dict(slots=2, env=env)})
    try:
        connect(load_settings(broker_url=fleet.url, secret=fleet.secret, durability=mode))
        submit.delay(noop, 0).get(timeout=60)  # the queue's first publish declares it (Celery's way): untimed
        for _ in range(args.delays):
            t = time.perf_counter()
            submit.delay(noop, 1)
            seen[mode, "delay"].append(time.perf_counter() - t)
        for _ in range(args.chunks):
            sigs = [submit.s(noop, i) for i in range(1000)]
            t = time.perf_counter()
            submit_batch(sigs, chunk_size=1000)
            seen[mode, "chunk"].append(time.perf_counter() - t)
        submit_batch([submit.s(noop, i) for i in range(10)]).get(timeout=300)  # behind what waited: all done
        fleet.group.wait_synced()
        t = time.perf_counter()
        submit_batch([submit.s(noop, i) for i in range(args.jobs)]).get(timeout=300)
        seen[mode, "finished job"].append((time.perf_counter() - t) / args.jobs)
    finally:
        fleet.stop_workers()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delays", type=int, default=200)
    parser.add_argument("--chunks", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--name", default="issue30_durability_cost.txt")
    args = parser.parse_args()
    unwind_on_signals()
    report = Report("durability_cost")
    report(f"$ python benchmarks/durability_cost.py --rounds {args.rounds} --delays {args.delays} "
           f"--chunks {args.chunks} --jobs {args.jobs}")
    report(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; Sentinel group on loopback: a primary, "
           "1 replica, 3 sentinels; 1 worker x 2 slots")
    seen: dict = {(m, what): [] for m in MODES for what in ("delay", "chunk", "finished job")}
    with tempfile.TemporaryDirectory() as tmp:
        fleet = SentinelFleet(Path(tmp), secret="bench-secret", password="bench-pw", torch=False)
        fleet.start_redis()
        try:
            for r in range(args.rounds):
                for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                    one_mode(fleet, mode, args, seen)
                    report(f"round {r + 1} {mode:10s} delay {statistics.median(seen[mode, 'delay'][-args.delays:]) * 1e3:.3f} ms"
                           f"  chunk {statistics.median(seen[mode, 'chunk'][-args.chunks:]) * 1e3:.1f} ms"
                           f"  finished job {seen[mode, 'finished job'][-1] * 1e6:.0f} us")
        finally:
            fleet.stop()
    report("")
    report(f"{'':14s}{'local':>12s}{'replicated':>12s}{'added':>12s}")
    for what, unit, scale in (("delay", "ms", 1e3), ("chunk", "ms", 1e3), ("finished job", "us", 1e6)):
        local, replicated = (statistics.median(seen[m, what]) * scale for m in MODES)
        report(f"{what + ' (' + unit + ')':14s}{local:12.3f}{replicated:12.3f}{replicated - local:+12.3f}")
        report.result(what.replace(" ", "_"), **{f"local_{unit}": local, f"replicated_{unit}": replicated,
                                                f"added_{unit}": replicated - local})
    print(f"written to {write_results(report.lines, args.name)}")


if __name__ == "__main__":
    main()
