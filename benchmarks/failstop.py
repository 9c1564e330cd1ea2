"""Fail-fast: how soon after one rank fails every rank of the gang, on every worker, is stopped.

One run starts one Redis on a free loopback port and 2 ``gpulayer worker``
processes with 2 slots each, in one zone (the fleet of ``startup.py``). Each run
submits a 2 workers x 2 processes job in which every rank passes a barrier, then
rank 3 raises ``ValueError`` while ranks 0-2 block in an ``all_reduce``.

Per run:

- *failure*: the time rank 3 recorded when it caught its exception (its
  report's ``failed_at``, taken before it reports and exits);
- *all stopped*: the latest node report's ``stopped_at`` (its agent's time once
  every local rank was reaped); a node whose ranks all exited by themselves has
  ``stopped_at`` None and counts at its ``finished_at``;
- *client raised*: when ``.get()`` raised ``JobFailed`` in this script.

It also counts the runs whose failure names rank 3 (the rank that failed
first: the others fail later, collateral, once it is gone), and checks that no
rank process is left under the workers and that the slot ledger is empty after
each run and at the end.

    python benchmarks/failstop.py [--runs 20] [--launcher direct|direct-fresh|torchrun]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from common import unwind_on_signals, write_results  # same folder
from startup import NODES, PROCS, Report, header, start_fleet, stop_fleet  # same folder

GET_TIMEOUT = 180.0
FREE_TIMEOUT = 10.0
GOAL_S = 0.1
VARIANTS = {"direct": ("direct", True), "direct-fresh": ("direct", False), "torchrun": ("torchrun", False)}


def rank3_raises():
    """The failing job (sent by value), as ``rank3_raises`` in tests/test_distributed.py minus the pid set."""
    import time

    import torch
    import torch.distributed as dist

    import gpulayer

    gpulayer.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 3:
        raise ValueError("rank three has a bad shard")
    dist.all_reduce(torch.ones(1))  # the others block here until they are stopped
    time.sleep(120)


def run_one(variant: str, store, worker_pids: list[int]) -> dict:
    from gpulayer import JobFailed, distributed

    launcher, warm = VARIANTS[variant]
    job = distributed(rank3_raises, nodes=NODES, procs_per_node=PROCS, launcher=launcher, warm=warm)
    try:
        job.get(timeout=GET_TIMEOUT)
    except JobFailed as err:
        raised_at = time.time()
        error = err
    else:
        raise AssertionError(f"job {job.id} succeeded; rank 3 should have failed it")
    named = getattr(error, "rank", None) if error.type_name == "ValueError" else None
    reports = store.failures(job.id, 0)
    rank3 = [f["failed_at"] for f in reports if f.get("rank") == 3 and f.get("failed_at")]
    failed_at = min(rank3) if rank3 else min(f["at"] for f in reports)
    nodes = store.nodes(job.id, 0)
    if len(nodes) != NODES:
        raise AssertionError(f"job {job.id}: {len(nodes)} node reports after .get() raised, expected {NODES}")
    node_stop = {n: (r["stopped_at"] if r["stopped_at"] is not None else r["finished_at"]) - failed_at
                 for n, r in sorted(nodes.items())}

    t0 = time.monotonic()  # the agents give the slots back just after their node report
    while store.held() and time.monotonic() - t0 < FREE_TIMEOUT:
        time.sleep(0.01)
    free_after = time.monotonic() - t0
    return {"stopped": max(node_stop.values()), "raised": raised_at - failed_at, "nodes": node_stop, "named": named,
            "states": [nodes[n]["state"] for n in sorted(nodes)], "held": store.held(), "free_after": free_after,
            "leftover": leftover_ranks(worker_pids)}


def leftover_ranks(worker_pids: list[int]) -> list[int]:
    """Rank processes (``-m gpulayer.gang.rank``, or torchrun) still alive under the workers."""
    found = []
    for pid in worker_pids:
        try:
            children = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for c in children:
            try:
                cmd = " ".join(c.cmdline())
                if ("gpulayer.gang.rank" in cmd or "torchrun" in cmd or "torch.distributed.run" in cmd) \
                        and c.status() != psutil.STATUS_ZOMBIE:
                    found.append(c.pid)
            except psutil.NoSuchProcess:
                pass
    return found


def benchmark(args: argparse.Namespace) -> list[str]:
    from gpulayer.app import redis_client
    from gpulayer.store.gangs import GangStore
    from gpulayer.lab.fleet import Fleet

    out = Report()
    header(out, "failstop.py")
    out(f"# {NODES} workers x {PROCS} slots (one zone), job {NODES} x {PROCS} ranks, gloo, launcher "
        f"{args.launcher} ({'fresh interpreters' if args.launcher == 'direct-fresh' else 'warm' if args.launcher == 'direct' else 'torchrun'}); rank 3 raises after a barrier, ranks 0-2 block in all_reduce; runs {args.runs} "
        f"(+1 warm-up)")
    workdir = Path(tempfile.mkdtemp(prefix="gl-failstop-"))
    rows: list[dict] = []
    fleet = Fleet(workdir)
    try:
        start_fleet(fleet)
        store = GangStore(redis_client())
        worker_pids = [p.pid for p in fleet.workers.values()]
        run_one(args.launcher, store, worker_pids)  # warm-up: page cache, worker imports
        out()
        out(f"{'run':>3}  {'all stopped s':>13} {'client raised s':>15}  {'node stops s (state)':<38} "
            f"{'slots free s':>12}  {'named':>5}  leftover ranks")
        for r in range(args.runs):
            row = run_one(args.launcher, store, worker_pids)
            rows.append(row)
            stops = ", ".join(f"{n}: {s:.3f} ({st})" for (n, s), st in zip(row["nodes"].items(), row["states"]))
            out(f"{r + 1:>3}  {row['stopped']:>13.3f} {row['raised']:>15.3f}  {stops:<38} "
                f"{row['free_after']:>12.3f}  {str(row['named']):>5}  {len(row['leftover'])}")
        held_end = store.held()
    finally:
        stop_fleet(fleet)
        shutil.rmtree(workdir, ignore_errors=True)

    stopped = [r["stopped"] for r in rows]
    raised = [r["raised"] for r in rows]
    out()
    named = sum(1 for r in rows if r["named"] == 3)
    out(f"the failure names rank 3 (the first to fail) in {named} of {args.runs} runs")
    out(f"over {args.runs} runs, seconds after rank 3 caught its exception:")
    out(f"  every rank stopped:  median {statistics.median(stopped):.3f}  max {max(stopped):.3f}  (goal <= "
        f"{GOAL_S:.1f} s: {'met' if max(stopped) <= GOAL_S else 'NOT met'} by the max, "
        f"{'met' if statistics.median(stopped) <= GOAL_S else 'NOT met'} by the median)")
    out(f"  client .get() raised: median {statistics.median(raised):.3f}  max {max(raised):.3f}")
    dirty = [i + 1 for i, r in enumerate(rows) if r["held"] or r["leftover"]]
    out(f"slot ledger after the last run: {held_end}  ({'empty' if held_end == {} else 'NOT empty'}); "
        f"runs with held slots or leftover ranks: {dirty or 'none'}")
    return out.lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="measured runs; median and max are quoted (default 20)")
    p.add_argument("--launcher", choices=tuple(VARIANTS), default="direct",
                   help="direct (warm ranks, the default), direct-fresh (warm=False) or torchrun")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    unwind_on_signals()
    lines = benchmark(args)
    suffix = "" if args.launcher == "direct" else f"-{args.launcher}"
    print(f"\nwritten to {write_results(lines, f'failstop{suffix}.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
