"""Thirty simulated machines: three workloads, submit styles, distributed jobs, a failure, and worker kills.

One run builds a shaped ``gpulayer.lab.netns`` lab (default ``2r x 3z x 5m``: 2 regions x 3 zones x 5
machines; in-zone unlimited, 2 Gbit/s across zones, 200 Mbit/s across regions, rate only), Redis on
its bridge (the control plane unshaped), and one real ``gpulayer worker`` per machine with
``--slots`` (``benchmarks/lab.py``). Two phases, the workers restarted between them:

1. **light workers** (no torch preload, no warm rank template: ``GPULAYER_PRELOAD=``,
   ``GPULAYER_WARM_RANKS=0``), for jobs that don't use torch:
   - *tiny jobs*: ``--tiny`` x ``i * i`` (``submit_batch``);
   - *data shards*: ``--shards`` jobs of about 0.5 s each: 0.45 s of waiting (the stand-in for reading a
     shard) plus a SHA-256 of 1 MiB (this 2-core host cannot give 60 slots 0.5 s of CPU each);
   - *submit styles*: ``--compare`` tiny jobs with one ``submit.delay`` per job vs one ``submit_batch``,
     alternating, ``--rounds`` each: submit time (until the last publish returned) and total;
   - *worker kills*: ``--kill-jobs`` jobs of 1 s; once a third of them have finished, the worker main
     process on 3 machines (3 zones) is SIGKILLed (its pool processes die with it). Counted: results
     present and right, jobs failed, jobs lost, and re-runs (each run of a job pushes its index to a
     Redis list when it starts).
2. **torch workers** on the first ``--torch-machines`` machines (default: all of them) (torch and ``gpulayer.trainer``
   preloaded, warm rank templates; ``gpulayer worker`` preloads torch by default, the Trainer with
   ``GPULAYER_PRELOAD=torch,gpulayer.trainer``):
   - *learning-rate sweep*: ``--sweep`` small training runs (``gpulayer.trainer.Trainer``, a 16-32-1 MLP,
     1,024 synthetic samples, batch 64, 1 epoch = 16 steps, SGD with momentum, one learning rate each);
   - *distributed jobs* 8 x 2 and 16 x 2 (gloo, one ``all_reduce``), direct launcher (warm ranks) and
     torchrun, ``--dist-runs`` each, alternating: from the ``distributed()`` call until ``.get()`` returned;
   - *a failure in an 8-machine job*: 8 x 2, the last rank raises after a barrier; every rank's pid is
     polled from outside until none is alive (``across_machines.failure_stop``).

For each workload: wall clock (first publish to last result), summed task time (each job's own
start/end stamps), parallelism (summed / wall), jobs/s, and jobs per worker (min / median / max over
the workers that ran any). Each figure is also printed as ``result {json}`` for
``scripts/make_perf_charts.py``.

    python benchmarks/scale_test.py [--topology "2r x 3z x 5m"] [--slots 2] [--tiny 5000] [--shards 2000]
        [--sweep 480] [--compare 2000] [--rounds 2] [--kill-jobs 600] [--dist-runs 3] [--torch-machines N]
        [--dead-after 15] [--skip PHASE,...] [--out scale_test.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import psutil

from across_machines import failure_stop, gang_run, wait_slots_free  # same folder
from common import Report, unwind_on_signals, write_results  # same folder
from lab import lab_fleet  # same folder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpulayer import JobFailed, submit, submit_batch  # noqa: E402
from gpulayer.app import redis_client, registry  # noqa: E402
from gpulayer.lab.netns import Topology  # noqa: E402
from gpulayer.lab.fleet import wait_until  # noqa: E402


# -- the jobs (sent by value) -----------------------------------------------------------------------
def _me() -> str:
    from gpulayer.procs.runtime import current_worker

    w = current_worker()
    return w.id if w else "?"


def tiny(i):
    import time

    t0 = time.time()
    return {"v": i * i, "t0": t0, "t1": time.time(), "w": _me()}


def shard(i):
    import hashlib
    import os
    import time

    t0 = time.time()
    time.sleep(0.45)
    digest = hashlib.sha256(os.urandom(1 << 20)).hexdigest()[:8]
    return {"v": i, "digest": digest, "t0": t0, "t1": time.time(), "w": _me()}


def counted(i, url, key, seconds):
    """A job that notes each run of itself (re-runs after a kill show as duplicates) and takes ``seconds``."""
    import time

    import redis

    t0 = time.time()
    r = redis.Redis.from_url(url)
    r.rpush(key, i)
    r.close()
    time.sleep(seconds)
    return {"v": i, "t0": t0, "t1": time.time(), "w": _me()}


def train_run(lr, seed=0):
    import time

    import torch

    from gpulayer.trainer import Module, Trainer

    t0 = time.time()
    torch.manual_seed(seed)
    x = torch.randn(1024, 16)
    y = (x @ torch.randn(16, 1)).squeeze(1) + 0.1 * torch.randn(1024)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            xb, yb = batch
            loss = torch.nn.functional.mse_loss(self.net(xb).squeeze(1), yb)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=lr, momentum=0.9)

    trainer = Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    trainer.fit(Net(), loader)
    return {"v": lr, "loss": float(trainer.callback_metrics["loss"]), "t0": t0, "t1": time.time(), "w": _me()}


# -- measuring --------------------------------------------------------------------------------------
def workload(log: Report, case: str, sigs: list, workers: int, timeout: float = 1800) -> list[dict]:
    """``submit_batch`` the signatures, wait for all, print the workload's figures; returns the results."""
    t0 = time.time()
    hs = submit_batch(sigs)
    published = time.time() - t0
    out = hs.get(timeout=timeout)
    wall = time.time() - t0
    task = sum(r["t1"] - r["t0"] for r in out)
    per = Counter(r["w"] for r in out)
    counts = sorted(per.values())
    log(f"  {case:<18} {len(out):>6} jobs  wall {wall:7.2f} s  task time {task:8.1f} s  parallelism {task / wall:5.1f}"
        f"  {len(out) / wall:7.1f} jobs/s  per worker {counts[0]}/{statistics.median(counts):g}/{counts[-1]} "
        f"(min/median/max over {len(per)} of {workers} workers)  published in {published:.2f} s")
    log.result(case, jobs=len(out), wall_s=wall, task_s=task, parallelism=task / wall, jobs_per_s=len(out) / wall,
               per_worker_min=counts[0], per_worker_median=statistics.median(counts), per_worker_max=counts[-1],
               workers_used=len(per), workers=workers, published_s=published)
    return out


def submit_styles(log: Report, n: int, rounds: int) -> None:
    rows: dict[str, list[tuple[float, float]]] = {"delay": [], "submit_batch": []}
    for r in range(rounds):
        for style in (list(rows) if r % 2 == 0 else list(rows)[::-1]):
            t0 = time.perf_counter()
            if style == "delay":
                hs = [submit.delay(tiny, i) for i in range(n)]
                published = time.perf_counter() - t0
                out = [h.get(timeout=600) for h in hs]
            else:
                hb = submit_batch([submit.s(tiny, i) for i in range(n)])
                published = time.perf_counter() - t0
                out = hb.get(timeout=600)
            total = time.perf_counter() - t0
            assert [o["v"] for o in out] == [i * i for i in range(n)], f"{style}: a result is missing or wrong"
            rows[style].append((published, total))
            log(f"  round {r + 1} {style:<13} submit {published:6.2f} s  total {total:6.2f} s  ({n / total:.0f} jobs/s)")
    med = {k: (statistics.median(p for p, _ in v), statistics.median(t for _, t in v)) for k, v in rows.items()}
    for k, (p, t) in med.items():
        log.result(f"{n} jobs {k}", submit_s=p, total_s=t, jobs_per_s=n / t, rounds=rounds)
    log(f"  medians: delay submit {med['delay'][0]:.2f} s total {med['delay'][1]:.2f} s; submit_batch submit "
        f"{med['submit_batch'][0]:.2f} s total {med['submit_batch'][1]:.2f} s; submit time delay / batch "
        f"{med['delay'][0] / med['submit_batch'][0]:.1f}x, total {med['delay'][1] / med['submit_batch'][1]:.2f}x")


def kill_run(log: Report, lf, n: int) -> None:
    client = redis_client()
    key = f"bench:kills:{uuid.uuid4().hex}"
    machines = {}
    for m in lf.lab.machines:  # one machine in each of the first three zones (not the first machine of each)
        if m.zone not in machines and len(machines) < 3 and m.name.endswith("-m2"):
            machines[m.zone] = m.name
    victims = list(machines.values())
    try:
        t0 = time.time()
        hs = submit_batch([submit.s(counted, i, lf.fleet.url, key, 1.0) for i in range(n)])
        wait_until(lambda: client.llen(key) >= n // 3, 600, "a third of the jobs to start", every=0.05)
        killed_at = time.time() - t0
        for name in victims:
            lf.fleet.kill_worker(name)
        got = hs.get(timeout=900, propagate=False)
        results = [r for r in got if isinstance(r, dict)]
        failed = sum(1 for r in got if isinstance(r, JobFailed))
        wall = time.time() - t0
        runs = Counter(int(x) for x in client.lrange(key, 0, -1))
        present = sorted(r["v"] for r in results)
        lost = n - len(set(present)) - failed
        rerun = sum(1 for c in runs.values() if c > 1)
        ran_on_victims = sum(1 for r in results if r["w"] in victims)
        log(f"  {n} jobs of 1 s; worker main processes SIGKILLed on {', '.join(victims)} at {killed_at:.1f} s "
            f"(once {n // 3} jobs had started): {len(results)} results, all right: {present == list(range(n))}; "
            f"failed {failed}, lost {lost}; {rerun} jobs ran again elsewhere ({sum(runs.values())} runs in all; "
            f"{ran_on_victims} results came from the killed workers before they died); wall {wall:.1f} s")
        log.result("kills on 3 machines", jobs=n, failed=failed, lost=lost, rerun=rerun, wall_s=wall,
                   killed_at_s=killed_at, all_right=present == list(range(n)))
    finally:
        client.delete(key)
        client.close()
    # Back to a full fleet for what follows, once the registry has let the dead ones go (names are unique).
    wait_until(lambda: not set(victims) & {w.id for w in registry().snapshot()}, 120,
               "the killed workers to leave the registry", every=0.2)
    for name in victims:
        lf.fleet.add_worker(name, wait=False, **lf.specs(lf.torch)[name])
    lf.wait_workers(victims, timeout=300)


def distributed_jobs(log: Report, runs: int, machines: int) -> None:
    for nodes in (8, 16):
        if nodes > machines:
            log(f"  {nodes} x 2: skipped, the lab has {machines} machines")
            continue
        rows: dict[str, list[dict]] = {"direct": [], "torchrun": []}
        for r in range(runs):
            for launcher in (list(rows) if r % 2 == 0 else list(rows)[::-1]):
                try:
                    row = gang_run(nodes, 2, launcher, timeout=1800)
                except JobFailed as err:  # e.g. a worker starved past its heartbeat deadline on this host
                    log(f"  {nodes} x 2 {launcher:<9} FAILED: {err}")
                    log.result(f"{nodes}x2 {launcher} failed", error=str(err)[:200])
                    try:
                        wait_slots_free(120)
                    except TimeoutError as late:
                        log(f"  ({late})")
                    continue
                rows[launcher].append(row)
                log(f"  {nodes} x 2 {launcher:<9} {row['seconds']:7.2f} s  ({row['reason']})")
        if not all(rows.values()):
            continue
        med = {k: statistics.median(x["seconds"] for x in v) for k, v in rows.items()}
        for k, v in med.items():
            log.result(f"{nodes}x2 {k}", seconds=v, runs=len(rows[k]))
        log(f"  {nodes} x 2 medians: direct {med['direct']:.2f} s, torchrun {med['torchrun']:.2f} s, "
            f"torchrun / direct {med['torchrun'] / med['direct']:.2f}x")


def memory_line(log: Report, lf, what: str) -> None:
    mem = lf.memory()
    vm = psutil.virtual_memory()
    log(f"  memory, {what}: {mem['rss_mib_per_machine']:.0f} MiB RSS, {mem['uss_mib_per_machine']:.0f} MiB USS "
        f"(unshared) per machine over {mem['machines']} machines; host used {vm.used / 2**30:.1f} of "
        f"{vm.total / 2**30:.1f} GiB (shared with other work)")
    log.result(f"memory {what}", rss_mib=mem["rss_mib_per_machine"], uss_mib=mem["uss_mib_per_machine"],
               machines=mem["machines"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default="2r x 3z x 5m")
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--tiny", type=int, default=5000)
    p.add_argument("--shards", type=int, default=2000)
    p.add_argument("--sweep", type=int, default=480)
    p.add_argument("--compare", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--kill-jobs", type=int, default=600)
    p.add_argument("--dist-runs", type=int, default=3)
    p.add_argument("--torch-machines", type=int, default=0,
                   help="machines that run torch workers in phase 2 (default 0: all of them; a torch worker "
                        "takes ~250 MiB unshared, so 30 need ~7.5 GiB free; 16 is what 16 x 2 needs)")
    p.add_argument("--dead-after", type=float, default=15.0,
                   help="worker_dead_after for every worker and this client (default 15 s, not gpulayer's 5: "
                        "while 16 x 2 torchrun starts 48 interpreters importing torch on 2 shared cores, a "
                        "worker's heartbeat can miss 5 s; the direct launcher's runs pass at 5)")
    p.add_argument("--skip", default="", help="comma-separated: tiny,shards,compare,kills,sweep,dist,failure")
    p.add_argument("--out", default="scale_test.txt")
    args = p.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    os.environ["GPULAYER_WORKER_DEAD_AFTER"] = repr(args.dead_after)  # the workers inherit it, the client reads it
    unwind_on_signals()
    topo = Topology.parse(args.topology)
    log = Report("scale_test")
    log(f"scale_test.py  {time.strftime('%Y-%m-%d %H:%M:%S')}  python {platform.python_version()}  "
        f"{os.cpu_count()} CPUs  load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    log(f"lab {topo.count} machines ({topo.describe()}), {args.slots} slots each; sizes: tiny {args.tiny}, shards "
        f"{args.shards} x ~0.5 s, sweep {args.sweep} runs, submit styles {args.compare} jobs x {args.rounds} rounds, "
        f"kills during {args.kill_jobs} jobs, distributed 8x2/16x2 x {args.dist_runs} runs; worker_dead_after "
        f"{args.dead_after:g} s; skipped: {sorted(skip) or 'none'}")
    t_start = time.monotonic()

    def save():  # after each section, so a run cut short keeps what it measured
        write_results(log.lines, args.out)

    with tempfile.TemporaryDirectory(prefix="gl-scale-") as tmp, \
            lab_fleet(Path(tmp), topo, slots=args.slots, start=False) as lf:
        log(f"network: {lf.lab.shaping.describe()}; Redis on the bridge {lf.lab.host_address} (control plane unshaped)")
        lf.fleet.connect()
        workers = topo.count
        if not {"tiny", "shards", "compare", "kills"} <= skip:
            started = lf.start_workers(torch=False)
            log(f"\nphase 1: light workers (no torch preload, no warm ranks), {topo.count} started in {started:.0f} s")
            memory_line(log, lf, "light workers")
            submit.delay(tiny, 0).get(timeout=120)
        if "tiny" not in skip:
            workload(log, "tiny jobs", [submit.s(tiny, i) for i in range(args.tiny)], workers)
            save()
        if "shards" not in skip:
            workload(log, "data shards", [submit.s(shard, i) for i in range(args.shards)], workers)
            save()
        if "compare" not in skip:
            log(f"\none submit.delay per job vs submit_batch, {args.compare} tiny jobs, {args.rounds} rounds alternating")
            submit_styles(log, args.compare, args.rounds)
            save()
        if "kills" not in skip:
            log("\nworker kills on 3 machines")
            kill_run(log, lf, args.kill_jobs)
            save()
        if not {"sweep", "dist", "failure"} <= skip:
            workers = min(args.torch_machines or topo.count, topo.count)
            started = lf.restart(torch=True, machines=workers)
            log(f"\nphase 2: torch workers (torch and the Trainer preloaded, warm rank templates) on the first "
                f"{workers} machines ({', '.join(sorted({m.zone for m in lf.lab.machines[:workers]}))}), "
                f"restarted in {started:.0f} s")
            memory_line(log, lf, "torch workers")
            save()
            if "sweep" not in skip:
                lrs = [round(1e-3 * (30 ** (k / max(1, args.sweep - 1))), 6) for k in range(args.sweep)]
                out = workload(log, "lr sweep", [submit.s(train_run, lr) for lr in lrs], workers)
                best = min(out, key=lambda r: r["loss"])
                log(f"  best of the sweep: lr {best['v']:g}, final loss {best['loss']:.4f}")
                save()
            if "dist" not in skip:
                log(f"\ndistributed jobs (gloo all_reduce), {args.dist_runs} runs per launcher, alternating")
                gang_run(2, 2, "direct")  # warm-up: the coordinator, a warm template
                distributed_jobs(log, args.dist_runs, workers)
                save()
            if "failure" not in skip and workers >= 8:
                log("\none rank failing in an 8-machine job (8 x 2, direct)")
                row = failure_stop(lf.fleet.url, 8, 2, timeout=900)
                log(f"  every rank's pid on {row['machines']} machines gone {row['all_gone']:.3f} s after the failure; "
                    f"client raised at {row['raised']:.3f} s ({row['error']})")
                log.result("failure 8x2", all_gone_s=row["all_gone"], raised_s=row["raised"],
                           machines=row["machines"])
                log(f"  goal: every rank stopped within 1 s: {'met' if row['all_gone'] <= 1 else 'NOT met'}")
    log(f"\ntotal {time.monotonic() - t_start:.0f} s; load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("wrote", write_results(log.lines, args.out))


if __name__ == "__main__":
    main()
