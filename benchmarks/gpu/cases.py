"""The CUDA cases ``benchmarks/gpu/run_all.sh`` measures, one subcommand each.

    python benchmarks/gpu/cases.py plan                  # what would run, and its sizes (any machine)
    python benchmarks/gpu/cases.py trainer --out DIR     # Trainer vs Lightning vs raw loop on CUDA
    python benchmarks/gpu/cases.py routing --out DIR     # CUDA jobs routed onto the GPU worker, refusal
    python benchmarks/gpu/cases.py nccl --out DIR        # a 1 x N distributed job on NCCL, N = GPUs

``--rehearse`` runs the same code on a CPU machine instead (gloo, ``--cuda off``, CPU tensors, tiny sizes):
it checks the plumbing, not CUDA, and writes its logs with a ``-rehearsal`` suffix.

The trainer subcommand is ``benchmarks/lightning_comparison/bench.py``'s driver (fresh processes, the
(long - short) / steps method, the same three frameworks) on the CUDA cases below. The routing and nccl
subcommands start a throwaway fleet (``gpulayer.lab.fleet.Fleet``: a Redis and workers on loopback, stopped
by pid) because ``gpulayer.init()``'s embedded cluster starts its workers with ``--cuda off``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

# -- sizes: run_all.sh must finish in under 8 minutes on one GPU ---------------------------------------
TRAINER_REPEATS = 2        # fresh processes per (case, framework, step count); bench.py's default is 3
ROUTING_JOBS = 40          # timed CUDA jobs, and as many CPU jobs
ROUTING_BATCH = 200        # CUDA jobs in one submit_batch
NCCL_RUNS = 3              # distributed jobs per launcher variant
NCCL_SIZES_MB = (1, 64)    # all_reduce payloads timed inside each rank
NCCL_ITERS = 20

FILTER = "CUDA"  # every case's name holds it: bench.py --cases FILTER runs exactly these


def trainer_cases(device: str = "cuda") -> list[dict]:
    """bench.py case dicts: the MLP in fp32, fp16 and bf16 mixed precision, and the CNN with cuDNN
    autotuning and copy-ahead both on and both off. ``device="cpu"``: the rehearsal's two cases."""
    mlp = {"model": "mlp", "batch": 256, "device": device}
    cnn = {"model": "cnn", "batch": 256, "precision": "32-true", "device": device}
    cases = [
        {"name": "CUDA MLP fp32, batch 256", "precision": "32-true", **mlp},
        {"name": "CUDA MLP 16-mixed, batch 256", "precision": "16-mixed", **mlp},
        {"name": "CUDA MLP bf16-mixed, batch 256", "precision": "bf16-mixed", **mlp},
        {"name": "CUDA CNN fp32, autotune + copy-ahead", "cudnn_benchmark": True, "prefetch": True, **cnn},
        {"name": "CUDA CNN fp32, no autotune, no copy-ahead", "cudnn_benchmark": False, "prefetch": False, **cnn},
    ]
    if device == "cpu":
        cases = [dict(c, name=c["name"] + " (rehearsed on CPU)") for c in (cases[0], cases[-1])]
    return cases


def plan(gpus: int | None = None) -> list[str]:
    """What run_all.sh runs, with its sizes (pure: no GPU, no torch needed)."""
    n = len(trainer_cases())
    g = "N" if gpus is None else str(gpus)
    return [
        f"trainer: {n} cases ({'; '.join(c['name'] for c in trainer_cases())}) x raw / Lightning / gpulayer x "
        f"100 and 600 steps x {TRAINER_REPEATS} fresh processes = {n * 3 * 2 * TRAINER_REPEATS} processes "
        "(bench.py's method: ms/step = (median at 600 - median at 100) / 500)",
        f"routing: a CUDA worker (--cuda on, one slot per GPU) and a CPU worker; {ROUTING_JOBS} CUDA jobs and "
        f"{ROUTING_JOBS} CPU jobs one at a time (where each ran, its GPU, round trip), {ROUTING_BATCH} CUDA jobs "
        "in one submit_batch (jobs/s), and a job asking for one GPU more than the worker has (refused, reason)",
        f"nccl: distributed(nodes=1, procs_per_node={g}, backend='nccl', resources=Resources(cuda=True)) "
        f"(N = the GPUs), direct warm / direct fresh / torchrun x {NCCL_RUNS} runs (wall time, rank timeline), "
        f"all_reduce of {' and '.join(f'{s} MB' for s in NCCL_SIZES_MB)} x {NCCL_ITERS} in each rank (GB/s)",
    ]


# -- shared ----------------------------------------------------------------------------------------------
def header(kind: str) -> list[str]:
    import torch

    cuda = torch.cuda.is_available()
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    return [f"# gpu {kind}  {datetime.datetime.now().isoformat(timespec='seconds')}  host {socket.gethostname()}",
            f"# torch {torch.__version__}  cuda {torch.version.cuda}  python {platform.python_version()}  "
            f"cpus {os.cpu_count()}  load {os.getloadavg()[0]:.1f}  gpus {names or 'none'}"]


def write_log(out: Path, name: str, lines: list[str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text("\n".join(lines) + "\n")
    print(f"written to {path}")
    return path


def median_ms(values: list[float]) -> str:
    return f"{1000 * statistics.median(values):.1f} ms" if values else "-"


# -- trainer ---------------------------------------------------------------------------------------------
def run_trainer(out: Path, rehearse: bool, repeats: int) -> None:
    """bench.py's own driver, on this file's cases (its --worker processes take a case by value)."""
    spec = importlib.util.spec_from_file_location("bench", REPO / "benchmarks" / "lightning_comparison" / "bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.cases = lambda quick: trainer_cases("cpu" if rehearse else "cuda")
    sys.argv = [str(bench.__file__), "--cases", FILTER, "--out", str(out), "--repeats", str(repeats)]
    sys.argv += ["--quick"] if rehearse else []
    bench.main()


# -- routing ---------------------------------------------------------------------------------------------
def gpu_job(device: str, n: int = 2048) -> dict:
    """Runs on a worker: which worker and GPU it got, and one matrix product there."""
    import torch

    import gpulayer

    t0 = time.perf_counter()
    x = torch.randn(n, n, device=device)
    checksum = float((x @ x).sum())  # the host read waits for the product
    job = gpulayer.current_job()
    return {"worker": job.worker.id if job else None, "gpus": list(job.gpus) if job else [],
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid(),
            "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "compute_s": time.perf_counter() - t0, "finite": checksum == checksum}


def cpu_job() -> dict:
    import gpulayer

    job = gpulayer.current_job()
    return {"worker": job.worker.id if job else None, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


def run_routing(out: Path, rehearse: bool, jobs: int) -> None:
    from gpulayer import JobRejected, Resources, submit, submit_batch
    from gpulayer.lab.fleet import Fleet

    gpus = 0 if rehearse else _gpu_count()
    device = "cpu" if rehearse else "cuda"
    n = 256 if rehearse else 2048  # the matrix of each timed CUDA job
    # Rehearsed, the "GPU" worker is a CPU worker the CUDA jobs are pinned to: the plumbing, not the routing.
    cuda_res = Resources(worker_ids=("gpu-1",)) if rehearse else Resources(cuda=True)
    lines = header("routing") + [f"# {jobs} CUDA jobs and {jobs} CPU jobs one at a time, then a submit_batch of CUDA "
                                 "jobs; round trip = submit.delay() to .get() returned"]
    with tempfile.TemporaryDirectory(prefix="gpu-routing-") as tmp, Fleet(Path(tmp)) as fleet:
        fleet.add_workers({"gpu-1": dict(slots=max(gpus, 1), cuda="off" if rehearse else "on", zone="lab-a",
                                         region="lab"),
                           "cpu-1": dict(slots=2, cuda="off", zone="lab-a", region="lab")})
        fleet.connect()
        first_t = time.perf_counter()
        first = submit.delay(gpu_job, device, n, resources=cuda_res).get(timeout=120)
        first_t = time.perf_counter() - first_t
        lines.append(f"first CUDA job (initialises CUDA in its pool process): {1000 * first_t:.0f} ms on "
                     f"{first['worker']} gpus {first['gpus']} CUDA_VISIBLE_DEVICES={first['visible']} "
                     f"device {first['device']}")
        rows = {"cuda": [], "cpu": []}
        for kind, fn, args, res in (("cuda", gpu_job, (device, n), cuda_res), ("cpu", cpu_job, (), Resources())):
            for _ in range(jobs):
                t = time.perf_counter()
                r = submit.delay(fn, *args, resources=res).get(timeout=60)
                rows[kind].append((time.perf_counter() - t, r))
        for kind, got in rows.items():
            where = sorted({r["worker"] for _, r in got})
            lines.append(f"{kind} jobs: {len(got)}, ran on {where}, round trip median "
                         f"{median_ms([t for t, _ in got])}, min {median_ms([min(t for t, _ in got)])}")
        misrouted = [r for _, r in rows["cuda"] if r["worker"] != "gpu-1" or not r["finite"]]
        lines.append(f"cuda jobs off the GPU worker or with a non-finite product: {len(misrouted)}")
        compute = [r["compute_s"] for _, r in rows["cuda"]]
        lines.append(f"{n} x {n} matmul inside a warm CUDA job (incl. randn, sum, sync): median {median_ms(compute)}")
        batch = 4 * jobs if rehearse else ROUTING_BATCH
        t = time.perf_counter()
        results = submit_batch([submit.s(gpu_job, device, 256) for _ in range(batch)],
                               resources=cuda_res).get(timeout=300)
        wall = time.perf_counter() - t
        lines.append(f"submit_batch of {batch} CUDA jobs: {wall:.2f} s, {batch / wall:.0f} jobs/s, "
                     f"on {sorted({r['worker'] for r in results})}")
        refused = False
        try:
            submit.delay(cpu_job, resources=Resources(cuda=True, gpus=gpus + 1))
            lines.append(f"asked for {gpus + 1} GPUs: NOT refused")
        except JobRejected as err:
            refused = True
            lines.append(f"asked for {gpus + 1} GPUs: refused: {err}")
        failed = len(misrouted) + (not refused)
    for line in lines:
        print(line)
    write_log(out, "gpu_routing" + ("-rehearsal" if rehearse else "") + ".txt", lines)
    if failed:
        raise SystemExit(f"routing: {failed} check(s) failed (see the log)")


# -- nccl ------------------------------------------------------------------------------------------------
def nccl_rank(backend: str, sizes_mb: tuple[int, ...], iters: int) -> dict:
    """One rank: the process group on ``backend``, then timed all_reduces of each size."""
    stamps = {"entered": time.time()}
    import torch
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    cuda = backend == "nccl"
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    stamps["torch"] = time.time()
    dist.init_process_group(backend, device_id=device if cuda else None)
    t = torch.ones(1, device=device)
    dist.all_reduce(t)  # the first collective sets up the communicator
    if cuda:
        torch.cuda.synchronize()
    stamps["group"] = time.time()
    world = dist.get_world_size()
    rates = {}
    for mb in sizes_mb:
        x = torch.ones(mb * 2**20 // 4, device=device)
        dist.all_reduce(x)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        if cuda:
            torch.cuda.synchronize()
        per = (time.perf_counter() - t0) / iters
        # bus bandwidth as nccl-tests counts it: 2 (n - 1) / n of the bytes cross a link per all_reduce
        rates[mb] = {"ms": 1000 * per, "busbw_GBps": (2 * (world - 1) / world) * mb * 2**20 / per / 1e9}
    ok = float(t.item()) == world
    rank = dist.get_rank()
    dist.destroy_process_group()
    stamps["done"] = time.time()
    return {"rank": rank, "world": world,
            "ok": ok, "rates": rates, "stamps": stamps,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None}


def run_nccl(out: Path, rehearse: bool, runs: int) -> None:
    from gpulayer import Resources, distributed
    from gpulayer.lab.fleet import Fleet

    gpus = 0 if rehearse else _gpu_count()
    procs, backend = (2, "gloo") if rehearse else (gpus, "nccl")
    res = Resources(worker_ids=("gpu-1",)) if rehearse else Resources(cuda=True)
    sizes = (1,) if rehearse else NCCL_SIZES_MB
    iters = 3 if rehearse else NCCL_ITERS
    variants = [("direct warm", "direct", True), ("direct fresh", "direct", False), ("torchrun", "torchrun", False)]
    lines = header("nccl") + [f"# distributed(nodes=1, procs_per_node={procs}, backend={backend!r}): wall = the "
                              f"call until .get() returned; {runs} runs per variant, rotating which goes first"]
    walls = {v: [] for v, _, _ in variants}
    failed = 0
    with tempfile.TemporaryDirectory(prefix="gpu-nccl-") as tmp, Fleet(Path(tmp)) as fleet:
        fleet.add_worker("gpu-1", slots=max(procs, 1), cuda="off" if rehearse else "on", zone="lab-a", region="lab")
        fleet.connect()
        warmups = 0 if rehearse else 1  # a rehearsal checks the code path, not figures: no uncounted round
        for i in range(warmups, runs + 1):  # round 0 warms up every variant and is not counted
            order = variants[i % 3:] + variants[:i % 3]
            for name, launcher, warm in order:
                t0 = time.time()
                job = distributed(nccl_rank, backend, sizes, iters, nodes=1, procs_per_node=procs, resources=res,
                                  backend=backend, launcher=launcher, warm=warm, timeout=120)
                ranks = job.get(timeout=180)
                wall = time.time() - t0
                bad = [r["rank"] for r in ranks if not r["ok"]]
                failed += len(bad)
                r0 = ranks[0]
                timeline = "  ".join(f"{k} +{max(r['stamps'][k] for r in ranks) - t0:.2f}s"
                                     for k in ("entered", "torch", "group", "done"))
                rates = "  ".join(f"{mb} MB {r['ms']:.3f} ms {r['busbw_GBps']:.1f} GB/s"
                                  for mb, r in r0["rates"].items())
                lines.append(f"{'warm-up' if i == 0 else f'run {i}'} | {name} | wall {wall:.2f} s | {timeline} | "
                             f"{rates} | nccl {r0['nccl']} | wrong ranks {bad or 'none'}")
                print(lines[-1], flush=True)
                if i:
                    walls[name].append(wall)
    lines.append("")
    for name, values in walls.items():
        lines.append(f"{name:<13} median wall {statistics.median(values):.2f} s over {len(values)} runs")
    base = statistics.median(walls["direct warm"])
    lines.append(f"torchrun / direct warm: {statistics.median(walls['torchrun']) / base:.2f}x")
    if procs == 1:
        lines.append("note: one GPU, so one rank: NCCL's all_reduce moves nothing between GPUs (bus bandwidth 0); "
                     "this measures NCCL's set-up and the launch, not a link")
    for line in lines[-5:]:
        print(line)
    write_log(out, "gpu_nccl" + ("-rehearsal" if rehearse else "") + ".txt", lines)
    if failed:
        raise SystemExit(f"nccl: {failed} rank(s) got a wrong all_reduce result")


def _gpu_count() -> int:
    import torch

    n = torch.cuda.device_count()
    if n == 0:
        raise SystemExit("no CUDA GPU: torch.cuda.device_count() is 0 (use --rehearse to run this on CPU)")
    return n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", choices=("plan", "trainer", "routing", "nccl"))
    ap.add_argument("--out", type=Path, default=None, help="results folder (default: a temporary one)")
    ap.add_argument("--rehearse", action="store_true", help="run on CPU: gloo, --cuda off, tiny sizes")
    ap.add_argument("--repeats", type=int, default=TRAINER_REPEATS, help="trainer: fresh processes per point")
    ap.add_argument("--jobs", type=int, default=ROUTING_JOBS, help="routing: timed jobs of each kind")
    ap.add_argument("--runs", type=int, default=NCCL_RUNS, help="nccl: runs per launcher variant")
    args = ap.parse_args(argv)
    if args.case == "plan":
        print("\n".join(plan()))
        return
    from common import unwind_on_signals

    unwind_on_signals()  # Ctrl-C or run_all.sh's timeout unwinds through the fleet's stop
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu-cases-"))
    if args.case == "trainer":
        run_trainer(out, args.rehearse, 1 if args.rehearse else args.repeats)
    elif args.case == "routing":
        run_routing(out, args.rehearse, min(args.jobs, 5) if args.rehearse else args.jobs)
    else:
        run_nccl(out, args.rehearse, 1 if args.rehearse else args.runs)


if __name__ == "__main__":
    main()
