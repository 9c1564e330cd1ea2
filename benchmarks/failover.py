"""Tiny jobs (and optionally distributed jobs) through a broker failover: nothing lost, nothing booked twice.

    python benchmarks/failover.py [--how kill|stop] [--jobs 10000] [--rate 400] [--runs 5] [--workers 2]
                                  [--slots 2] [--gang] [--durability local|replicated|strict] [--min-replicas N]
                                  [--batch 200] [--delays 20] [--back-after S | --never-back] [--output NAME]

A Sentinel group on loopback (a primary, ``--replicas`` replicas (default 1), 3 sentinels, down-after-milliseconds 2000) and ``--workers``
workers of ``--slots`` slots. Each run sends ``--jobs`` tiny jobs at ``--rate`` a second, in turn one
``submit_batch`` of ``--batch`` (200) and ``--delays`` (20) ``delay`` calls, and a third of the way in sends the primary SIGKILL (``--how kill``)
or SIGSTOP (``--how stop``; SIGCONT once the sentinels named a new one, and it comes back as a replica). The
next run fails over the new primary the same way (the killed server is started again as a replica first).

Counted per run:
- lost: jobs whose ``delay()`` or batch returned (acknowledged) and that never got a result (waited for 120 s
  after the last one); a batch whose publish was cut by the switch raised ``ClusterUnavailable`` and was not
  acknowledged: it is sent again with the same ids and counted (as is a call that raised ``NotReplicated``);
- ran twice: jobs whose function ran to the end more than once (each run appends a line to a side file of its
  pool process): a rerun after its ack was lost with the old primary; its result is stored once (the first);
- wrong: results that are not ``i * i``;
- back after: for each worker that runs jobs (with ``--gang``, not the two the first gang holds), seconds from the kill until it starts a job sent after the kill (a job
  only the new primary can have handed out); "every worker" is the slowest worker of the run; p50/p99 over the runs
  (and over runs x workers for "a worker").

``--gang``: also a 2 x ``--slots`` gang whose ranks sleep 15 s through the switch and 3 more gangs of that shape
sent right after it (they wait for its slots); at the end a ledger audit from the ranks' own marks: the most ranks
a worker ran at once (never more than its slots), the ledger empty, every gang succeeded, the first with one
attempt, and the waiting ones placed after the switch.

``--durability`` is passed to every process as ``GPULAYER_DURABILITY`` (acknowledge a write once a replica has it,
``replicated``, or at once, ``local``); a gpulayer without that setting ignores it. ``--min-replicas N`` as
``GPULAYER_MIN_REPLICAS`` (1: refuse a write no replica confirmed, rather than go on degraded).

``--never-back``: the killed primary is not started again during the run (a machine lost; it comes back only
before the next run, to give that run a replica): with one replica the new primary has none, so with
``replicated`` durability writes go on degraded (or, with ``--min-replicas 1``, are refused). Also counted then:
calls accepted at their first try, and seconds from the kill to the first job sent after it that started.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from common import Report, unwind_on_signals, write_results  # same folder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpulayer.lab.fleet import wait_until  # noqa: E402
from gpulayer.lab.sentinel_fleet import SentinelFleet  # noqa: E402

BATCH = 200  # --batch
DELAYS = 20  # --delays
GANG_SLEEP = 15.0


def job(i: int, sent: float, marks: str) -> int:
    """``i * i``; appends ``<job id> <i> <worker> <sent> <started>`` to its pool process's side file."""
    from gpulayer.procs import runtime

    started = time.time()
    ctx = runtime.current_job()
    line = f"{ctx.job_id if ctx else '-'} {i} {ctx.worker.id if ctx else '-'} {sent:.6f} {started:.6f}\n"
    with open(os.path.join(marks, f"{os.getpid()}.jobs"), "a") as f:
        f.write(line)
    return i * i


def rank(marks: str, seconds: float) -> int:
    """Sleeps ``seconds``; leaves ``<gang> <attempt> <rank> <worker> <start> <end>`` (end on SIGTERM too)."""
    start = time.time()
    name = (f"{os.environ['GPULAYER_GANG_ID']} {os.environ['TORCHELASTIC_RESTART_COUNT']} {os.environ['RANK']} "
            f"{os.environ['GPULAYER_WORKER_ID']} {start:.6f}")

    def ended(*_):
        with open(os.path.join(marks, f"{os.getpid()}.rank"), "w") as f:
            f.write(f"{name} {time.time():.6f}\n")

    def stopped(*_):
        ended()
        os._exit(143)

    signal.signal(signal.SIGTERM, stopped)
    time.sleep(seconds)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    ended()
    return int(os.environ["RANK"])


LOST = object()


def one_result(job_id: str):
    """A job's result, or ``LOST`` when it has none (its batch already waited 120 s)."""
    from gpulayer.app import app

    try:
        return app.AsyncResult(job_id).get(timeout=1)
    except Exception:  # noqa: BLE001
        return LOST


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def send_all(args, marks: Path, handles: list, kill_at: int, killed: threading.Event, kill,
             refused: list) -> tuple[int, int]:
    """Sends ``args.jobs`` jobs at ``args.rate``; calls ``kill()`` (in a thread) once ``kill_at`` were sent.
    ``handles``: (first i, handle) of every acknowledged batch and job. A call that raised (``ClusterUnavailable``:
    cut by the switch; ``NotReplicated``: no replica confirmed it) is sent again with the same job ids, except
    with ``--never-back`` a ``NotReplicated`` one, whose jobs are added to ``refused[0]``. Returns (calls sent
    again after ClusterUnavailable, after NotReplicated)."""
    from celery.utils import uuid

    from gpulayer import submit, submit_batch
    from gpulayer.errors import ClusterUnavailable, NotReplicated

    resent = {ClusterUnavailable: 0, NotReplicated: 0}

    def until_acknowledged(call):
        while True:
            try:
                return call()
            except (ClusterUnavailable, NotReplicated) as err:  # not acknowledged: the same ids again
                resent[ClusterUnavailable if isinstance(err, ClusterUnavailable) else NotReplicated] += 1
                if args.never_back and isinstance(err, NotReplicated):  # no replica will ever confirm it: refused
                    return None

    def accept(first: int, n: int, call) -> None:
        handle = until_acknowledged(call)
        if handle is None:
            refused[0] += n
        else:
            handles.append((first, handle))

    t0 = time.monotonic()
    i = 0
    while i < args.jobs:
        if i >= kill_at and not killed.is_set():
            killed.set()
            threading.Thread(target=kill, daemon=True).start()
        n = min(args.batch, args.jobs - i)
        sent = time.time()
        sigs = [submit.s(job, j, sent, str(marks)).set(task_id=uuid()) for j in range(i, i + n)]
        accept(i, n, lambda: submit_batch(sigs))
        i += n
        for _ in range(min(args.delays, args.jobs - i)):
            sent, job_id = time.time(), uuid()
            accept(i, 1, lambda: submit.apply_async((job, i, sent, str(marks)), task_id=job_id))
            i += 1
        time.sleep(max(0.0, t0 + i / args.rate - time.monotonic()))
    return resent[ClusterUnavailable], resent[NotReplicated]


def run_once(args, fleet: SentinelFleet, run: int, out: Report, back: list[float], every: list[float]) -> dict:
    from gpulayer import distributed

    marks = Path(tempfile.mkdtemp(prefix="gl-failover-marks-"))
    fleet.group.restart_after = 0
    fleet.group.tend()  # the server an earlier run killed comes back, as a replica
    fleet.group.wait_synced()
    fleet.wait_workers(list(fleet.workers), timeout=60)
    gangs = []
    if args.gang:
        gangs.append(distributed(rank, str(marks), GANG_SLEEP, nodes=2, procs_per_node=args.slots, timeout=300))
        gangs[0].placement  # noqa: B018 (placed before the others arrive)
        gangs += [distributed(rank, str(marks), 1.0, nodes=2, procs_per_node=args.slots, timeout=300)
                  for _ in range(3)]
    state: dict = {}
    frozen = []

    def kill():
        # No wait for the replica first: the primary dies mid-stream, with whatever the replica has not yet
        # received (GPULAYER_DURABILITY=replicated acknowledges a write only once it has).
        port = fleet.kill_primary(signal.SIGKILL if args.how == "kill" else signal.SIGSTOP)
        state["port"] = port
        state["at"] = time.time()  # after the signal: a job sent from now on can only reach the new primary
        if args.how == "stop":
            frozen.append(port)

    handles: list = []
    killed = threading.Event()
    t0 = time.time()
    tender = threading.Thread(target=bring_back, args=(args, fleet, state, frozen), daemon=True)
    tender.start()
    refused = [0]
    resent, unreplicated = send_all(args, marks, handles, args.jobs // 3, killed, kill, refused)
    wait_until(lambda: "at" in state, 120, "the kill")
    lost, wrong = 0, 0
    for first, h in handles:
        expect = [(first + k) ** 2 for k in range(len(h))] if hasattr(h, "ids") else [first * first]
        try:
            got = h.get(timeout=120, propagate=False) if hasattr(h, "ids") else [h.get(timeout=120)]
        except Exception:  # noqa: BLE001 (a job of it never finished: look at each)
            got = [one_result(job_id) for job_id in (h.ids if hasattr(h, "ids") else [h.id])]
        for job_id, want, value in zip(h.ids if hasattr(h, "ids") else [h.id], expect, got):
            if value is LOST:
                lost += 1
                if lost <= 3:
                    out(f"  lost job {job_id} (i {int(want ** 0.5)}): no result within 120 s")
            elif value != want:
                wrong += 1
    elapsed = time.time() - t0
    gang_notes = []
    if args.gang:
        for g in gangs:
            try:
                g.get(timeout=300)
                gang_notes.append("succeeded")
            except Exception as err:  # noqa: BLE001
                gang_notes.append(f"{type(err).__name__}: {str(err)[:120]}")
    state["done"] = True
    tender.join()
    if frozen and not state.get("resumed"):
        os.kill(fleet.group.procs[frozen[0]].pid, signal.SIGCONT)
    kill_at = state["at"]
    rows = [line.split() for p in marks.glob("*.jobs") for line in p.read_text().splitlines()]
    runs_per_id = Counter(r[0] for r in rows)
    twice = sum(1 for c in runs_per_id.values() if c > 1)
    ids = {job_id for _, h in handles for job_id in (h.ids if hasattr(h, "ids") else [h.id])}
    first_after: dict[str, float] = {}
    for job_id, _, worker, sent, started in rows:
        if float(sent) >= kill_at:
            first_after[worker] = min(first_after.get(worker, float("inf")), float(started) - kill_at)
    # Workers that ran jobs in this run, less those whose slots the first gang held at the kill (with --gang: they
    # run jobs again once it ends, 15 s in, which says nothing of the failover).
    held = set(gangs[0].placement.workers) if gangs else set()
    ran = sorted({r[2] for r in rows} - held)
    workers_back = [first_after.get(w, float("inf")) for w in ran]
    first_job = min(first_after.values(), default=float("inf"))
    back += workers_back
    every.append(max(workers_back))
    out(f"run {run}: {len(ids)} jobs acknowledged ({refused[0]} refused) in {elapsed:.1f} s; primary {state['port']} "
        f"{'killed' if args.how == 'kill' else 'frozen'} after {args.jobs // 3} sent; lost {lost}, wrong {wrong}, "
        f"ran twice {twice} (executions {len(rows)} for {len(ids)} ids, {len(set(runs_per_id) - ids)} of resent "
        f"batches' ids), calls sent again: {resent} cut by the switch, {unreplicated} not replicated; first job "
        f"sent after the kill started {first_job:.2f} s after it; back after (s): "
        + ", ".join(f"{w} {b:.2f}" for w, b in zip(ran, workers_back)))
    audit = gang_audit(fleet, marks, gangs, kill_at, args.slots) if args.gang else {}
    if args.gang:
        out(f"  gangs: {gang_notes}; " + "; ".join(f"{k} {v}" for k, v in audit.items()))
    if args.keep:
        out(f"  kept the jobs' and ranks' marks in {marks}")
    else:
        shutil.rmtree(marks, ignore_errors=True)
    if frozen:
        fleet.group.wait_synced(60)
    return {"lost": lost, "wrong": wrong, "twice": twice, "resent": resent + unreplicated, "back_every_s": max(workers_back),
            "first_job_s": first_job, "refused": refused[0],
            **({"gangs_ok": gang_notes.count("succeeded"), **audit} if args.gang else {})}


def bring_back(args, fleet: SentinelFleet, state: dict, frozen: list) -> None:
    """``--back-after S``: the old primary returns S seconds after the signal (SIGCONT, or started again from its
    files), as a replica of the new one, as ``gpulayer up``'s supervisor does (10 s): a group of one replica has
    none while it is away, so replicated writes wait for it."""
    if args.back_after is None:
        return
    while not state.get("done"):
        if "at" in state and time.time() - state["at"] >= args.back_after and not state.get("resumed"):
            if frozen:
                os.kill(fleet.group.procs[frozen[0]].pid, signal.SIGCONT)
            else:
                fleet.group.restart_after = 0
                fleet.group.tend()
            state["resumed"] = True
        time.sleep(0.2)


def gang_audit(fleet: SentinelFleet, marks: Path, gangs: list, kill_at: float, slots: int) -> dict:
    """Most ranks at once per worker, the ledger left, attempts of the first gang, waiting ones placed after."""
    from gpulayer.app import redis_client
    from gpulayer.store.gangs import GangStore

    rows = [line.split() for p in marks.glob("*.rank") for line in p.read_text().splitlines()]
    edges: dict[str, list] = {}
    for _, _, _, worker, start, end in rows:
        edges.setdefault(worker, []).extend([(float(start), 1), (float(end), -1)])
    most = 0
    for points in edges.values():
        now = 0
        for _, step in sorted(points):
            now += step
            most = max(most, now)
    store = GangStore(redis_client())
    wait_until(lambda: not store.held(), 60, "the ledger to empty")
    waiting_starts = [float(r[4]) for r in rows if r[0] != gangs[0].id]
    return {"most_ranks_at_once": most, "slots": slots, "ledger_left": store.held(),
            "first_gang_attempts": len(gangs[0].attempts) or 1,
            "waiting_placed_after_switch": all(s > kill_at for s in waiting_starts) and len(waiting_starts) > 0}


def back_when(args) -> str:
    if args.never_back:
        return "never in the run"
    return "after the run" if args.back_after is None else f"{args.back_after:g} s after the signal"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--how", choices=("kill", "stop"), default="kill")
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--rate", type=float, default=400.0, help="jobs sent per second (default 400)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--gang", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep the workers' logs and the marks (printed where)")
    p.add_argument("--replicas", type=int, default=1, help="replicas of the primary (default 1)")
    p.add_argument("--durability", choices=("local", "replicated", "strict"), default=None)
    p.add_argument("--min-replicas", type=int, default=None,
                   help="GPULAYER_MIN_REPLICAS for every process (1: refuse what no replica confirmed)")
    p.add_argument("--batch", type=int, default=BATCH, help=f"jobs per submit_batch (default {BATCH})")
    p.add_argument("--delays", type=int, default=DELAYS, help=f"delay calls after each batch (default {DELAYS})")
    p.add_argument("--never-back", action="store_true",
                   help="the killed primary is not started again during the run (a machine lost)")
    p.add_argument("--back-after", type=float, default=None,
                   help="seconds after the signal the old primary comes back (default: after the run; 10 with "
                        "--durability replicated, as gpulayer up)")
    p.add_argument("--output", default=None, help="results file under benchmarks/results/<date>-<host>/")
    args = p.parse_args(argv)
    if args.gang and args.workers < 3:
        args.workers = 3  # a 2-node gang fills two workers: the jobs run on the third meanwhile
    if args.never_back and args.back_after is not None:
        p.error("--never-back and --back-after contradict each other")
    if args.back_after is None and args.durability == "replicated" and not args.never_back:
        args.back_after = 10.0
    if args.durability:
        os.environ["GPULAYER_DURABILITY"] = args.durability  # this client's and (inherited) every worker's
    if args.min_replicas is not None:
        os.environ["GPULAYER_MIN_REPLICAS"] = str(args.min_replicas)
    unwind_on_signals()
    out = Report("failover")
    out(f"# failover.py --how {args.how}  {args.jobs} jobs at {args.rate:g}/s x {args.runs} runs, {args.workers} "
        f"workers x {args.slots} slots, batches of {args.batch} and {args.delays} delays, gang {args.gang}, "
        f"durability {args.durability or 'default'}, min_replicas "
        f"{args.min_replicas if args.min_replicas is not None else 'default'}, old primary back "
        f"{back_when(args)}  "
        f"(a primary, {args.replicas} replica(s), 3 sentinels, down-after 2000 ms)  load "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    workdir = Path(tempfile.mkdtemp(prefix="gl-failover-"))
    fleet = SentinelFleet(workdir, secret="failover-secret", password="failover-pw", torch=False,
                          down_after_ms=2000, replicas=args.replicas)
    totals: list[dict] = []
    back: list[float] = []
    every: list[float] = []
    try:
        fleet.start_redis()
        fleet.add_workers({f"f{i + 1}": dict(slots=args.slots) for i in range(args.workers)})
        fleet.connect()
        for run in range(1, args.runs + 1):
            totals.append(run_once(args, fleet, run, out, back, every))
    finally:
        fleet.stop()
        if args.keep:
            print(f"kept the fleet's logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    lost = sum(t["lost"] for t in totals)
    twice = sum(t["twice"] for t in totals)
    wrong = sum(t["wrong"] for t in totals)
    out(f"total over {len(totals)} runs: lost {lost}, wrong {wrong}, ran twice {twice}, batches resent "
        f"{sum(t['resent'] for t in totals)}; a worker back after p50 {statistics.median(back):.2f} s, p99 "
        f"{percentile(back, 0.99):.2f} s; every worker back after p50 {statistics.median(every):.2f} s, p99 "
        f"{percentile(every, 0.99):.2f} s; first job after the kill started after "
        + ", ".join(f"{t['first_job_s']:.2f}" for t in totals) + " s")
    out.result(f"{args.how}{'-gang' if args.gang else ''}", runs=len(totals), jobs=args.jobs, lost=lost,
               wrong=wrong, ran_twice=twice, worker_back_p50_s=statistics.median(back),
               worker_back_p99_s=percentile(back, 0.99), every_worker_back_p50_s=statistics.median(every),
               every_worker_back_p99_s=percentile(every, 0.99), durability=args.durability or "default",
               first_job_after_kill_max_s=max(t["first_job_s"] for t in totals),
               refused=sum(t["refused"] for t in totals),
               **({"gangs_ok": sum(t["gangs_ok"] for t in totals),
                   "most_ranks_at_once": max(t["most_ranks_at_once"] for t in totals)} if args.gang else {}))
    name = args.output or f"issue30_failover_{args.how}{'_gang' if args.gang else ''}.txt"
    print(f"\nwritten to {write_results(out.lines, name)}")
    return 0 if lost == 0 and wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
