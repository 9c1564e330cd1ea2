"""The across-machines table: routing and refusal, a 4-process job across machines, and the failure stop.

A shaped lab (``benchmarks/lab.py``) of 2 zones x 2 machines in one region and 1 machine in a second
region (5 machines, 2 slots each, real ``gpulayer worker`` processes with torch and warm ranks), then:

- **refusal**: ``submit.delay(fn, resources=Resources(cuda=True))`` against this CPU-only fleet raises
  ``JobRejected``; its reason is printed. Also a zone no worker has.
- **CUDA routing**: this machine has no GPU, so ``gpulayer worker --cuda on`` refuses to start here.
  What a worker started with ``--cuda on`` would register (the live snapshot plus that worker's
  ``WorkerInfo`` with 1 GPU) is handed to the router (``gpulayer.placement.route``): the queue it
  names and the workers that read it are a routing fact. No GPU ran.
- **4-process job across machines**: ``distributed(allreduce, nodes=2, procs_per_node=2)`` with the
  direct launcher (warm ranks) and torchrun, ``--runs`` each, alternating; time from the call until
  ``.get()`` returned; the placement and its reason; every result checked.
- **failure stop**: a 2 x 2 job whose last rank raises after a barrier while the others block in an
  ``all_reduce``; each rank publishes its pid first, and this script, outside, polls every pid until
  none is alive: the time from the failure (the failing rank's clock, same host) until the last rank
  process on any machine is gone.

The helpers ``gang_run`` and ``failure_stop`` are shared with ``scale_test.py``.

    python benchmarks/across_machines.py [--runs 3]
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
from pathlib import Path

import psutil

from common import Report, unwind_on_signals, write_results  # same folder
from lab import lab_fleet  # same folder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpulayer import JobFailed, JobRejected, Resources, distributed, submit  # noqa: E402
from gpulayer.app import redis_client, registry  # noqa: E402
from gpulayer.models import WorkerInfo  # noqa: E402
from gpulayer.lab.netns import Topology  # noqa: E402
from gpulayer.placement import route  # noqa: E402
from gpulayer.store.gangs import GangStore  # noqa: E402
from gpulayer.lab.fleet import wait_until  # noqa: E402

TOPOLOGY = Topology({"r1": {"r1-a": 2, "r1-b": 2}, "r2": {"r2-a": 1}})


def allreduce_one():
    """The job of benchmarks/startup.py: a process group and one all_reduce (sent by value)."""
    import torch
    import torch.distributed as dist

    import gpulayer

    gpulayer.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def last_rank_raises(url: str, key: str):
    """Publishes this rank's pid, passes a barrier; the last rank records the time and raises, the others block."""
    import os
    import time

    import redis
    import torch
    import torch.distributed as dist

    import gpulayer

    r = redis.Redis.from_url(url)
    r.rpush(key + ":pids", os.getpid())
    gpulayer.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == dist.get_world_size() - 1:
        r.set(key + ":failed_at", repr(time.time()))
        raise ValueError("the last rank has a bad shard")
    dist.all_reduce(torch.ones(1))  # the others block here until they are stopped
    time.sleep(300)


def wait_slots_free(timeout: float = 60) -> None:
    store = GangStore(redis_client())
    wait_until(lambda: store.held() == {}, timeout, "every slot to be free after the job", every=0.05)


def gang_run(nodes: int, procs: int, launcher: str, timeout: float = 600) -> dict:
    """One all_reduce job: seconds from the call until ``.get()`` returned, and where it ran."""
    t0 = time.perf_counter()
    job = distributed(allreduce_one, nodes=nodes, procs_per_node=procs, launcher=launcher)
    out = job.get(timeout=timeout)
    elapsed = time.perf_counter() - t0
    world = nodes * procs
    if out != [float(world)] * world:
        raise AssertionError(f"{launcher} {nodes} x {procs}: wrong all_reduce results {out}")
    wait_slots_free()
    return {"seconds": elapsed, "reason": job.placement.reason, "workers": list(job.placement.workers)}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def failure_stop(url: str, nodes: int, procs: int, launcher: str = "direct", timeout: float = 300) -> dict:
    """The last rank fails; seconds from its failure until every rank's pid is gone (polled from here)."""
    client = redis_client()
    key = f"bench:failstop:{uuid.uuid4().hex}"
    world = nodes * procs
    try:
        job = distributed(last_rank_raises, url, key, nodes=nodes, procs_per_node=procs, launcher=launcher)
        pids: list[int] = []
        deadline = time.monotonic() + timeout
        while len(pids) < world and time.monotonic() < deadline:
            got = client.blpop([key + ":pids"], timeout=1)
            if got:
                pids.append(int(got[1]))
        if len(pids) < world:
            raise TimeoutError(f"only {len(pids)} of {world} ranks published their pid within {timeout:g} s")
        alive = set(pids)
        while alive and time.monotonic() < deadline:
            alive = {p for p in alive if _alive(p)}
            if alive:
                time.sleep(0.002)
        gone_at = time.time()
        if alive:
            raise TimeoutError(f"ranks {sorted(alive)} still alive {timeout:g} s after the job started")
        try:
            job.get(timeout=120)
            raise AssertionError("the job succeeded; its last rank should have failed it")
        except JobFailed as err:
            raised_at, error = time.time(), err
        failed_at = float(client.get(key + ":failed_at"))
        wait_slots_free()
        return {"all_gone": gone_at - failed_at, "raised": raised_at - failed_at, "ranks": world,
                "machines": len(set(job.placement.workers)), "error": f"{error.type_name}: {str(error)[:120]}"}
    finally:
        client.delete(key + ":pids", key + ":failed_at")
        client.close()


def cuda_routing(line) -> None:
    snapshot = list(registry().snapshot())
    try:
        submit.delay(allreduce_one, resources=Resources(cuda=True))
        line("  cuda=True on the CPU fleet: NOT refused")
    except JobRejected as err:
        line(f"  refusal, cuda=True on the CPU fleet: JobRejected: {err}")
    try:
        submit.delay(allreduce_one, resources=Resources(zone="r9-z"))
        line("  zone r9-z: NOT refused")
    except (JobRejected, ValueError) as err:
        line(f"  refusal, a zone no worker has: {type(err).__name__}: {err}")
    base = snapshot[0]
    gpu = WorkerInfo(id="gpu-1", hostname="gpu-host", address="10.0.0.99", zone=base.zone, region=base.region,
                     gpus=1, gpu_names=("NVIDIA H100 80GB HBM3",), slots=1, pid=1, started_at=time.time())
    r = route(Resources(cuda=True), [*snapshot, gpu])
    line(f"  routing fact, cuda=True with a worker started with --cuda on (1 GPU) beside the CPU fleet: "
         f"queue {r.queue!r}, read by {list(r.eligible)} (no GPU ran: this machine has none, and "
         f"`gpulayer worker --cuda on` refuses to start here)")
    cpu = route(Resources(), [*snapshot, gpu])
    line(f"  routing fact, a CPU job on the same fleet: queue {cpu.queue!r}, read by {len(cpu.eligible)} workers "
         f"({'the GPU worker among them' if 'gpu-1' in cpu.eligible else 'not the GPU worker'})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    unwind_on_signals()
    line = Report("across_machines")
    result = line.result
    line(f"across_machines.py  {time.strftime('%Y-%m-%d %H:%M:%S')}  python {platform.python_version()}  "
         f"{os.cpu_count()} CPUs  load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="gl-across-") as tmp, \
            lab_fleet(Path(tmp), TOPOLOGY, slots=2, start=False) as lf:
        started = lf.start_workers(torch=True)
        line(f"lab: {TOPOLOGY.describe()}; {lf.lab.shaping.describe()}; Redis on the bridge "
             f"{lf.lab.host_address} (control plane unshaped); workers with torch and warm ranks, 2 slots each, "
             f"started in {started:.0f} s; memory {json.dumps({k: round(v) for k, v in lf.memory().items()})}")
        lf.fleet.connect()
        line("\nrouting and refusal")
        cuda_routing(line)
        line(f"\n4-process job across machines (2 x 2, gloo, all_reduce), {args.runs} runs per launcher, alternating; "
             f"+1 warm-up each")
        rows: dict[str, list[dict]] = {"direct": [], "torchrun": []}
        for launcher in rows:
            gang_run(2, 2, launcher)
        for r in range(args.runs):
            for launcher in (list(rows) if r % 2 == 0 else list(rows)[::-1]):
                row = gang_run(2, 2, launcher)
                rows[launcher].append(row)
                line(f"  run {r + 1} {launcher:<9} {row['seconds']:6.2f} s  on {row['workers']} ({row['reason']})")
        med = {k: statistics.median(x["seconds"] for x in v) for k, v in rows.items()}
        for k, v in med.items():
            result(f"2x2 {k}", seconds=v, runs=[round(x["seconds"], 3) for x in rows[k]])
        line(f"  medians: direct {med['direct']:.2f} s, torchrun {med['torchrun']:.2f} s, "
             f"torchrun / direct {med['torchrun'] / med['direct']:.2f}x")
        line(f"\nfailure stop (2 x 2, direct, the last rank raises after a barrier), {args.runs} runs")
        stops = []
        for r in range(args.runs):
            row = failure_stop(lf.fleet.url, 2, 2)
            stops.append(row)
            line(f"  run {r + 1}: every rank's pid gone {row['all_gone']:.3f} s after the failure, on "
                 f"{row['machines']} machines; client raised at {row['raised']:.3f} s ({row['error']})")
        worst = max(s["all_gone"] for s in stops)
        result("failure stop 2x2", all_gone_median=statistics.median(s["all_gone"] for s in stops),
               all_gone_max=worst, runs=len(stops))
        line(f"  goal: every rank stopped within 1 s: {'met' if worst <= 1 else 'NOT met'} (max {worst:.3f} s)")
    line(f"load average at the end {os.getloadavg()[0]:.1f}")
    print("wrote", write_results(line.lines, "across_machines.txt"))


if __name__ == "__main__":
    main()
