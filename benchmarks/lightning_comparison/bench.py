"""gpulayer's Trainer against Lightning 2.x and a raw PyTorch loop, measured side by side.

Method: every case runs at two step counts (100 and 600), each in three fresh
processes; ms/step = (median wall time at 600 - median at 100) / 500, the wall
time being first step to end of fit inside the process (process start-up varies
by seconds on a shared machine); the difference cancels first-step and teardown costs. Start-up is process start to the
first training step (median of the short runs).

    python benchmarks/lightning_comparison/bench.py            # full run (~10 min on 2 CPU cores)
    python benchmarks/lightning_comparison/bench.py --quick    # smoke run (~1-2 min)

Lightning runs without logger, progress bar, model summary or checkpoints;
gpulayer runs without checkpoints (its CSV logger stays on). Same model, data,
optimizer (AdamW) and one ``self.log`` of the loss per step in both; the raw loop
reads the loss every 50 steps, nanoGPT-style. The DDP case runs each trainer with
its defaults. CUDA cases (fp16 MLP, CNN with and without cuDNN autotuning and
copy-ahead) are added when torch sees a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FRAMEWORKS = ("raw", "lightning", "gpulayer")


# -- the workload (identical for the three) ------------------------------------------------------
def build_net(model: str) -> nn.Module:
    if model == "mlp":
        return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    return nn.Sequential(  # a small CNN on 3x32x32 images
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )


def build_loader(model: str, batch_size: int, pin: bool = False) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    n = batch_size * 50  # 50 steps per epoch: epoch turnovers are part of the measurement
    x = torch.randn(n, 64, generator=g) if model == "mlp" else torch.randn(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, drop_last=True, pin_memory=pin)


class StepBody:
    """Mixed into Lightning's and gpulayer's module classes: the same code for both."""

    def __init__(self, model: str):
        super().__init__()
        self.net = build_net(model)
        self.first_step_at: float | None = None

    def training_step(self, batch, batch_idx):
        if self.first_step_at is None:
            self.first_step_at = time.time()
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


# -- one measured process -------------------------------------------------------------------------
def run_raw(case: dict, steps: int) -> float:
    device = torch.device(case["device"])
    ddp = case.get("devices", 1) > 1
    peers = []
    if ddp:  # like Lightning's launcher: this process is rank 0 and starts the others with torchrun's env
        import torch.distributed as dist
        sys.path.insert(0, REPO)
        from gpulayer.procs.env import RankLayout, free_port, rank_env

        if "RANK" not in os.environ:
            port, n = free_port(), case["devices"]
            for local in range(1, n):
                env = rank_env(RankLayout(0, local, 1, n), master_addr="127.0.0.1", master_port=port, run_id="raw")
                peers.append(subprocess.Popen([sys.executable, *sys.argv], env=env))
            os.environ.update(rank_env(RankLayout(0, 0, 1, n), master_addr="127.0.0.1", master_port=port, run_id="raw"))
        dist.init_process_group("gloo")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // case["devices"]))
    torch.backends.cudnn.benchmark = case.get("cudnn_benchmark", True)
    torch.manual_seed(0)
    net = build_net(case["model"]).to(device)
    model = nn.parallel.DistributedDataParallel(net) if ddp else net
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    loader = build_loader(case["model"], case["batch"] // case.get("devices", 1), pin=device.type == "cuda")
    if ddp:
        from torch.utils.data import DistributedSampler
        loader = DataLoader(loader.dataset, batch_size=loader.batch_size, drop_last=True,
                            sampler=DistributedSampler(loader.dataset, shuffle=True))
    amp = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(case["precision"])
    scaler = torch.amp.GradScaler(device.type) if amp == torch.float16 else None
    # nanoGPT's pattern: a null context when there is nothing to autocast
    ctx = torch.autocast(device.type, dtype=amp) if amp is not None else contextlib.nullcontext()
    first, step, epoch = None, 0, 0
    while step < steps:
        if ddp:
            loader.sampler.set_epoch(epoch)
        for x, y in loader:
            if first is None:
                first = time.time()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with ctx:
                loss = nn.functional.cross_entropy(model(x), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step % 50 == 0:
                loss.item()  # nanoGPT reads the loss at its log interval
            if step == steps:
                break
        epoch += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    if ddp:
        dist.barrier()  # no rank tears gloo down while a peer still uses it (it can abort at exit otherwise)
        dist.destroy_process_group()
    for p in peers:
        if p.wait() != 0:
            raise RuntimeError(f"raw DDP rank exited with {p.returncode}")
    return first


def run_lightning(case: dict, steps: int) -> float | None:
    import lightning as L

    Net = type("LitNet", (StepBody, L.LightningModule), {})
    model = Net(case["model"])
    accelerator = "gpu" if case["device"] == "cuda" else "cpu"
    kwargs = dict(max_steps=steps, max_epochs=-1, accelerator=accelerator, devices=case.get("devices", 1),
                  precision=case["precision"], benchmark=case.get("cudnn_benchmark"))
    if not case.get("defaults"):
        kwargs.update(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    tmp = tempfile.mkdtemp(prefix="bench-lightning-")
    trainer = L.Trainer(default_root_dir=tmp, **kwargs)
    trainer.fit(model, build_loader(case["model"], case["batch"] // case.get("devices", 1),
                                    pin=case["device"] == "cuda"))
    return model.first_step_at if trainer.is_global_zero else None


def run_gpulayer(case: dict, steps: int) -> float:
    sys.path.insert(0, REPO)
    from gpulayer.trainer import Module, Trainer

    Net = type("GLNet", (StepBody, Module), {})
    model = Net(case["model"])
    kwargs = dict(max_steps=steps, accelerator=case["device"], devices=case.get("devices", 1),
                  precision=case["precision"], benchmark=case.get("cudnn_benchmark", True),
                  prefetch=case.get("prefetch", True))
    if not case.get("defaults"):
        kwargs.update(enable_checkpointing=False)
    tmp = tempfile.mkdtemp(prefix="bench-gpulayer-")
    loader = build_loader(case["model"], case["batch"] // case.get("devices", 1), pin=case["device"] == "cuda")
    if case.get("devices", 1) > 1:  # the steps happen in the ranks: a callback brings the time back
        from gpulayer.trainer import Callback

        class FirstStep(Callback):
            at = None

            def on_train_start(self, trainer, pl_module):
                self.at = time.time()

            def state_dict(self):
                return {"at": self.at}

            def load_state_dict(self, state):
                self.at = state["at"]

        probe = FirstStep()
        trainer = Trainer(default_root_dir=tmp, callbacks=[probe], **kwargs)
        trainer.fit(model, loader)
        return probe.at
    Trainer(default_root_dir=tmp, **kwargs).fit(model, loader)
    if case["device"] == "cuda":
        torch.cuda.synchronize()
    return model.first_step_at


def worker(case: dict, framework: str, steps: int) -> None:
    first = {"raw": run_raw, "lightning": run_lightning, "gpulayer": run_gpulayer}[framework](case, steps)
    if int(os.environ.get("RANK", "0")) == 0 and first is not None:
        print("RESULT " + json.dumps({"first_step_at": first, "end_at": time.time()}), flush=True)


# -- the driver -------------------------------------------------------------------------------------
def cases(quick: bool) -> list[dict]:
    out = [
        {"name": "MLP fp32, batch 256", "model": "mlp", "batch": 256, "precision": "32-true", "device": "cpu"},
        {"name": "MLP bf16-mixed, batch 256", "model": "mlp", "batch": 256, "precision": "bf16-mixed", "device": "cpu"},
        {"name": "small CNN fp32, batch 32", "model": "cnn", "batch": 32, "precision": "32-true", "device": "cpu"},
        {"name": "MLP DDP 2 CPU processes (defaults)", "model": "mlp", "batch": 256, "precision": "32-true",
         "device": "cpu", "devices": 2, "defaults": True},
    ]
    if torch.cuda.is_available():
        out += [
            {"name": "CUDA MLP 16-mixed, batch 256", "model": "mlp", "batch": 256, "precision": "16-mixed",
             "device": "cuda"},
            {"name": "CUDA CNN fp32, autotune + copy-ahead", "model": "cnn", "batch": 256, "precision": "32-true",
             "device": "cuda", "cudnn_benchmark": True, "prefetch": True},
            {"name": "CUDA CNN fp32, no autotune, no copy-ahead", "model": "cnn", "batch": 256, "precision": "32-true",
             "device": "cuda", "cudnn_benchmark": False, "prefetch": False},
        ]
    return out


def pin_core(threads: int) -> int | None:
    """The core every single-process run is pinned to (no migrations mid-fit); None when not pinning."""
    if threads != 1 or not hasattr(os, "sched_setaffinity"):
        return None
    return max(os.sched_getaffinity(0))


def measure(case: dict, framework: str, steps: int, timeout_s: float, threads: int) -> tuple[float, float, float]:
    """(wall seconds from the first step to the end of fit, of the whole process, and to the first step).

    The in-process span is what ms/step uses: on a shared machine the import time of a
    fresh process varies by seconds, which would swamp a 500-step difference. With one
    thread per process, single-process cases run pinned to one core (as ``taskset`` would).
    """
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(case), framework, str(steps)]
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    core = pin_core(threads) if case.get("devices", 1) == 1 else None
    pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
    start = time.time()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=REPO, env=env, preexec_fn=pin)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{framework} {case['name']} {steps} steps failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    result = json.loads(line[7:])
    return result["end_at"] - result["first_step_at"], wall, result["first_step_at"] - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run: 20 and 60 steps, one process each")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--cases", default=None,
                    help="run only the cases whose name contains this text (e.g. 'MLP fp32'); "
                         "results go to lightning_comparison_<text>.txt")
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS per process (default 1: on a shared machine OpenMP barriers spin against "
                         "other load and make multi-threaded timings meaningless; 0 leaves torch's default)")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results/<date>-<host>/)")
    ap.add_argument("--worker", nargs=3, metavar=("CASE", "FRAMEWORK", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        case, framework, steps = args.worker
        worker(json.loads(case), framework, int(steps))
        return

    short, long = (20, 60) if args.quick else (100, 600)
    repeats = args.repeats or (1 if args.quick else 3)
    import lightning

    sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/, for common (only here: the measured processes skip it)
    from common import result_line

    core = pin_core(args.threads)
    header = (f"# lightning_comparison  {datetime.datetime.now().isoformat(timespec='seconds')}  host {socket.gethostname()}\n"
              f"# torch {torch.__version__}  lightning {lightning.__version__}  python {platform.python_version()}  "
              f"cpus {os.cpu_count()}  cuda {torch.cuda.is_available()}  OMP_NUM_THREADS {args.threads or 'default'}  "
              f"load {os.getloadavg()[0]:.1f}\n"
              f"# ms/step = (median wall at {long} - median at {short}) / {long - short}, wall = first step to end of fit "
              f"in the process; "
              f"{repeats} fresh process(es) per point; start-up = process start to first step (median)"
              + ("" if core is None else f"; single-process cases pinned to core {core}") + "\n")
    print(header, flush=True)
    raw_lines, rows = [], []
    todo = [c for c in cases(args.quick) if not args.cases or args.cases in c["name"]]
    path = _results_path(args)
    for case in todo:
        walls = {(f, n): [] for f in FRAMEWORKS for n in (short, long)}
        starts = {f: [] for f in FRAMEWORKS}
        for _ in range(repeats):
            for n in (short, long):
                for f in FRAMEWORKS:  # interleaved so machine noise spreads over all three
                    span, wall, start = measure(case, f, n, timeout_s=600, threads=args.threads)
                    walls[(f, n)].append(span)
                    if n == short:
                        starts[f].append(start)
                    raw_lines.append(f"{case['name']} | {f} | {n} steps | first step to end {span:.3f} s | "
                                     f"process {wall:.3f} s | start-up {start:.3f} s")
        ms = {f: 1000 * (statistics.median(walls[(f, long)]) - statistics.median(walls[(f, short)])) / (long - short)
              for f in FRAMEWORKS}
        st = {f: statistics.median(starts[f]) for f in FRAMEWORKS}
        rows.append((case["name"], ms, st))
        print(f"{case['name']}: raw {ms['raw']:.3f}  lightning {ms['lightning']:.3f}  gpulayer {ms['gpulayer']:.3f} ms/step",
              flush=True)
        done = "" if len(rows) == len(todo) else f"# partial: {len(rows)} of {len(todo)} cases measured so far\n"
        with open(path, "w") as f:  # after every case: a failure later keeps what was measured
            f.write(header + done + "\n" + _table(rows) + "\n\n" + _results(rows, result_line) + "\n\n# raw measurements\n"
                    + "\n".join(raw_lines) + "\n")

    print("\n" + _table(rows))
    print(f"\nwritten to {path}")


def _table(rows: list) -> str:
    table = [f"{'case':<44}{'raw ms/step':>12}{'lightning':>11}{'gpulayer':>10}{'speedup vs L':>14}"
             f"{'overhead vs raw':>17}"]
    for name, ms, _ in rows:
        table.append(f"{name:<44}{ms['raw']:>12.3f}{ms['lightning']:>11.3f}{ms['gpulayer']:>10.3f}"
                     f"{ms['lightning'] / ms['gpulayer']:>13.2f}x{100 * (ms['gpulayer'] / ms['raw'] - 1):>+16.1f}%")
    table.append("")
    table.append(f"{'start-up (process start to first step), s':<44}{'raw':>12}{'lightning':>11}{'gpulayer':>10}")
    for name, _, st in rows:
        table.append(f"{name:<44}{st['raw']:>12.2f}{st['lightning']:>11.2f}{st['gpulayer']:>10.2f}")
    return "\n".join(table)


def _results(rows: list, result_line) -> str:
    """The table's figures as ``result {json}`` lines, one per case, for scripts/make_perf_charts.py."""
    return "\n".join(result_line("lightning_comparison", name, **{f"{f}_ms_per_step": round(ms[f], 4) for f in FRAMEWORKS},
                                  **{f"{f}_startup_s": round(st[f], 3) for f in FRAMEWORKS}) for name, ms, st in rows)


def _results_path(args: argparse.Namespace) -> str:
    out = args.out or os.path.join(REPO, "benchmarks", "results",
                                   f"{datetime.date.today().isoformat()}-{socket.gethostname()}")
    os.makedirs(out, exist_ok=True)
    name = "lightning_comparison_quick.txt" if args.quick else "lightning_comparison.txt"
    if args.cases:
        name = name.replace(".txt", "_" + "".join(c if c.isalnum() else "-" for c in args.cases).lower() + ".txt")
    return os.path.join(out, name)


if __name__ == "__main__":
    main()
