"""Flat against two-level all-reduce on 8 simulated machines x 2 processes, by gradient size.

What the lab can show about gradient sync: its links are slowed by rate only (no ``netem`` here, so no
delay), so a large all-reduce costs bandwidth and CPU copies, about the same both ways, while a small
one costs hops, each waiting for its receiver to get a core, which two-level sync makes fewer. One
``distributed()`` job of 8 x 2 on ``scaling.py``'s lab (one region, two zones of 4 machines, 2 Gbit/s
between them); in every rank, per size, ``--iters`` all-reduces of a float32 tensor each way,
alternating rounds, after a warm-up:

- ``flat``: ``torch.distributed.all_reduce`` over all 16 ranks (what DDP does on gloo);
- ``two-level``: the Trainer's ``gradsync`` path: a shared-memory sum inside each machine, one
  all-reduce among the 8 machines' first ranks, the total shared back (``ShmReducer.all_reduce_``).

The figure is rank 0's median time per all-reduce over ``--rounds`` rounds.

    python benchmarks/lightning_comparison/allreduce_probe.py [--sizes-mb 0.1,1,4,8] [--iters 10] [--rounds 5]

Writes ``benchmarks/results/<date>-<host>/allreduce_probe.txt``, one
``result {"bench": "allreduce_probe", "case": "<MB> MB", "flat_ms": ..., "two_level_ms": ..., "ratio": ...}`` per size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from scaling import SCALING_LAYOUT, describe_layout, open_lab, start_cluster  # same folder
from common import Report, unwind_on_signals, write_results  # benchmarks/, put on sys.path by scaling

NODES, PROCS = 8, 2


def probe(sizes: list[int], iters: int, rounds: int) -> dict:
    """In every rank: per size, ``rounds`` x (``iters`` flat, ``iters`` two-level) all-reduces; ms per op."""
    import time

    import torch
    import torch.distributed as dist

    import gpulayer
    from gpulayer.trainer.gradsync import build_state

    gpulayer.init_process_group("gloo")
    state = build_state(max(sizes) * 4)
    between = lambda t: dist.all_reduce(t, group=state.inter_group)  # noqa: E731

    def flat(t):
        dist.all_reduce(t)

    def two_level(t):
        state.shm.all_reduce_(t, between=between)

    out = {}
    try:
        for n in sizes:
            t = torch.ones(n)
            for fn in (flat, two_level):  # warm-up: connections, buffers
                fn(t)
            times = {"flat": [], "two_level": []}
            for r in range(rounds):
                order = (flat, two_level) if r % 2 == 0 else (two_level, flat)
                for fn in order:
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        fn(t)
                    times[fn.__name__].append(1000 * (time.perf_counter() - t0) / iters)
            out[n] = times
        return {"rank": dist.get_rank(), "times": out}
    finally:
        state.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mb", default="0.1,1,4,8", help="tensor sizes in MB, comma-separated (default 0.1,1,4,8)")
    p.add_argument("--iters", type=int, default=10, help="all-reduces per round and way (default 10)")
    p.add_argument("--rounds", type=int, default=5, help="rounds per size; medians are quoted (default 5)")
    p.add_argument("--out", default="allreduce_probe.txt")
    args = p.parse_args(argv)
    unwind_on_signals()
    sizes = [max(1, int(float(mb) * 1e6 / 4)) for mb in args.sizes_mb.split(",")]
    log = Report("allreduce_probe")
    lab, network = open_lab(SCALING_LAYOUT)
    try:
        with tempfile.TemporaryDirectory(prefix="gl-probe-") as tmp:
            fleet = start_cluster(lab, Path(tmp))
            try:
                from gpulayer import distributed

                log(f"# lab: {network}; {describe_layout(lab.machines)}")
                log(f"# {NODES} x {PROCS} gloo ranks, float32 tensors, {args.iters} all-reduces per round and way, "
                    f"{args.rounds} rounds alternating; rank 0's median ms per all-reduce")
                job = distributed(probe, sizes, args.iters, args.rounds, nodes=NODES, procs_per_node=PROCS)
                ranks = job.get(timeout=1800)
                log(f"# placement: {job.placement.reason}")
                rank0 = next(r for r in ranks if r["rank"] == 0)["times"]
                log(f"\n{'MB':>6} {'flat ms':>9} {'two-level ms':>13} {'flat / two-level':>17}")
                for n in sizes:
                    times = rank0[n] if n in rank0 else rank0[str(n)]
                    f, t = statistics.median(times["flat"]), statistics.median(times["two_level"])
                    mb = n * 4 / 1e6
                    log(f"{mb:>6.2f} {f:>9.2f} {t:>13.2f} {f / t:>16.2f}x")
                    log.result(f"{mb:g} MB", flat_ms=f, two_level_ms=t, ratio=f / t, flat_runs=times["flat"],
                               two_level_runs=times["two_level"], nodes=NODES, procs=PROCS)
            finally:
                fleet.stop()
    finally:
        lab.close()
    print(f"\nwritten to {write_results(log.lines, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
