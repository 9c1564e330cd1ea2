"""What waiting for a replica costs (``durability``, README "Sentinel"): "local" vs "replicated", side by side.

    python benchmarks/durability_cost.py [--rounds 20] [--calls 50] [--jobs 500]

One Sentinel group on loopback (a primary, one replica, three sentinels: ``gpulayer.lab.sentinel_fleet``) and
two workers (2 slots each, no torch), one per mode (``GPULAYER_DURABILITY``), both running throughout. Each
round measures both modes in turn, the order swapped every round, so a machine whose load moves (this one is
shared) weighs on both alike; the client connects in the round's mode, and its jobs go to that mode's worker:

- ``write``: one ``SET`` through gpulayer's connection, alone or with ``WAIT 1`` in its pipeline: the floor;
- ``delay``: ``submit.delay`` of a tiny job, ``--calls`` calls one at a time;
- ``chunk``: one ``submit_batch`` of 1,000 tiny jobs in one chunk (one pipeline; in "replicated" one WAIT);
- ``finished job``: a ``submit_batch`` of ``--jobs`` tiny jobs, until every result is read, per job: the
  worker's takes, results and acks (in "replicated", with the WAITs after them), once what the round sent
  before has run.

Figures are medians over every call (write, delay), or over the rounds (chunk, finished job). The replica is on
the same machine, so a WAIT costs a loopback round trip and the replica's work: across machines, add the
network's round trip to each acknowledged write.
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

from gpulayer import Resources, submit, submit_batch  # noqa: E402
from gpulayer.config import load_settings  # noqa: E402
from gpulayer.lab.sentinel_fleet import SentinelFleet  # noqa: E402
from gpulayer.session import connect  # noqa: E402
from gpulayer.store.connection import connect_redis  # noqa: E402

MODES = ("local", "replicated")
MEASURES = (("write", "ms", 1e3), ("delay", "ms", 1e3), ("chunk", "ms", 1e3), ("finished job", "us", 1e6))


def noop(x):
    return x


def bare_writes(client, mode: str, n: int, seen: dict) -> None:
    for i in range(n):
        t = time.perf_counter()
        with client.pipeline(transaction=False) as pipe:
            pipe.set("durability-bench", i)
            if mode == "replicated":
                pipe.execute_command("WAIT", 1, 2000)
            replies = pipe.execute()
        seen[mode, "write"].append(time.perf_counter() - t)
        assert mode == "local" or replies[-1] == 1, replies


def one_mode(fleet: SentinelFleet, client, mode: str, args, seen: dict) -> None:
    bare_writes(client, mode, args.calls, seen)
    connect(load_settings(broker_url=fleet.url, secret=fleet.secret, durability=mode))
    pinned = Resources(worker_ids=(f"d-{mode}",))
    handles = [submit.delay(noop, 0, resources=pinned)]  # (connects anew: another mode's connections are dropped)
    for _ in range(args.calls):
        t = time.perf_counter()
        handles.append(submit.delay(noop, 1, resources=pinned))
        seen[mode, "delay"].append(time.perf_counter() - t)
    sigs = [submit.s(noop, i) for i in range(1000)]
    t = time.perf_counter()
    chunk = submit_batch(sigs, resources=pinned, chunk_size=1000)
    seen[mode, "chunk"].append(time.perf_counter() - t)
    chunk.get(timeout=300)
    for h in handles:
        h.get(timeout=300)
    t = time.perf_counter()
    submit_batch([submit.s(noop, i) for i in range(args.jobs)], resources=pinned).get(timeout=300)
    seen[mode, "finished job"].append((time.perf_counter() - t) / args.jobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--name", default="issue30_durability_cost.txt")
    args = parser.parse_args()
    unwind_on_signals()
    report = Report("durability_cost")
    report(f"$ python benchmarks/durability_cost.py --rounds {args.rounds} --calls {args.calls} --jobs {args.jobs}")
    report(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start; Sentinel group on loopback: a "
           "primary, 1 replica, 3 sentinels; 2 workers x 2 slots (one per mode)")
    seen: dict = {(m, what): [] for m in MODES for what, _, _ in MEASURES}
    with tempfile.TemporaryDirectory() as tmp:
        fleet = SentinelFleet(Path(tmp), secret="bench-secret", password="bench-pw", torch=False)
        fleet.start_redis()
        try:
            fleet.add_workers({f"d-{m}": dict(slots=2, env=dict(os.environ, GPULAYER_DURABILITY=m)) for m in MODES})
            with connect_redis(fleet.url) as client:
                for r in range(args.rounds):
                    for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                        one_mode(fleet, client, mode, args, seen)
                    report(f"round {r + 1:2d} load {os.getloadavg()[0]:4.1f}  " + "  ".join(
                        f"{m}: write {statistics.median(seen[m, 'write'][-args.calls:]) * 1e3:.3f} ms, delay "
                        f"{statistics.median(seen[m, 'delay'][-args.calls:]) * 1e3:.2f} ms, chunk "
                        f"{seen[m, 'chunk'][-1] * 1e3:.0f} ms, finished job {seen[m, 'finished job'][-1] * 1e6:.0f} us"
                        for m in MODES))
        finally:
            fleet.stop()
    report("")
    report(f"{'median':18s}{'local':>12s}{'replicated':>12s}{'added':>12s}")
    for what, unit, scale in MEASURES:
        local, replicated = (statistics.median(seen[m, what]) * scale for m in MODES)
        report(f"{what + ' (' + unit + ')':18s}{local:12.3f}{replicated:12.3f}{replicated - local:+12.3f}")
        report.result(what.replace(" ", "_"), **{f"local_{unit}": local, f"replicated_{unit}": replicated,
                                                f"added_{unit}": replicated - local})
    print(f"written to {write_results(report.lines, args.name)}")


if __name__ == "__main__":
    main()
