"""FSDP2 vs DDP on CPU processes: step time and peak memory per rank, side by side in one process tree.

Claim: ``Trainer(strategy="fsdp", accelerator="cpu", devices=W)`` holds about 1/W of the parameters,
gradients and optimizer state in each rank, so its peak memory per rank is well under DDP's for the same
model, for a step time that pays the all-gathers and reduce-scatters over gloo. (Lightning refuses FSDP on
CPU: lightning#21812.)

    .venv/bin/python benchmarks/fsdp.py [--width 2048] [--depth 12] [--devices 2] [--steps 12] [--warmup 2] [--accelerator cpu|cuda] [--quick]

The model is ``depth`` blocks of ``Linear(width, width)`` + ReLU (width 2048, depth 12: 201 MB of fp32
parameters), trained with AdamW on random data, built in ``configure_model``: on the CPU for DDP, on the
meta device for FSDP (each rank allocates only its shards; every block is sharded on its own). Each rank
reports the growth of its resident memory from ``setup`` (before the layers exist) to the end of the fit
(the peak, ``VmHWM`` after resetting it), and rank 0 the wall time of each step; the medians over the
steps after ``warmup`` are printed, and FSDP/DDP ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from benchmarks.common import Report, unwind_on_signals, write_results  # noqa: E402
from gpulayer.trainer import Module, Trainer, seed_everything  # noqa: E402
from gpulayer.trainer.callbacks import Callback  # noqa: E402
from gpulayer.trainer.strategies import FSDPStrategy  # noqa: E402


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.linear(x))


class Stack(Module):
    def __init__(self, width: int, depth: int, meta: bool):
        super().__init__()
        self.width, self.depth, self.meta = width, depth, meta
        self.blocks: nn.Sequential | None = None

    def configure_model(self):
        if self.blocks is None:
            with torch.device("meta") if self.meta else torch.device("cpu"):
                self.blocks = nn.Sequential(*[Block(self.width) for _ in range(self.depth)])

    def load_state_dict(self, state_dict, strict=True, assign=False):
        if self.blocks is None:  # the caller's copy, which gets the trained weights: configure_model ran in the ranks
            self.meta = True
            self.configure_model()
            assign = True  # take the weights as they come instead of copying into meta tensors
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.blocks(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class Measure(Callback):
    """Each rank's peak resident growth during the fit; rank 0's step times."""

    def __init__(self):
        self.start_kib = 0
        self.peaks_mib: list[float] = []
        self.local_param_mib: list[float] = []
        self.step_s: list[float] = []
        self._last = 0.0
        self.cuda = False

    def setup(self, trainer, pl_module, stage):
        self.cuda = trainer.strategy.root_device.type == "cuda"
        if self.cuda:  # on a GPU the figure is the caching allocator's peak of allocated bytes
            torch.cuda.reset_peak_memory_stats()
            self.start_kib = torch.cuda.memory_allocated() // 1024
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM := VmRSS now: the peak counts from here
        except OSError:
            pass
        self.start_kib = _status_kib("VmRSS")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.cuda:
            torch.cuda.synchronize()
        self._last = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.cuda:
            torch.cuda.synchronize()
        self.step_s.append(time.perf_counter() - self._last)

    def on_train_end(self, trainer, pl_module):
        from torch.distributed.tensor import DTensor
        local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size()
                    for p in pl_module.parameters())
        peak_kib = torch.cuda.max_memory_allocated() // 1024 if self.cuda else _status_kib("VmHWM")
        mine = ((peak_kib - self.start_kib) / 1024, local / 2**20)
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        self.peaks_mib = [e[0] for e in every]
        self.local_param_mib = [e[1] for e in every]

    def state_dict(self):
        return {"peaks_mib": self.peaks_mib, "local_param_mib": self.local_param_mib, "step_s": self.step_s}

    def load_state_dict(self, state):
        self.__dict__.update(state)


def run(strategy, args, meta: bool) -> Measure:
    seed_everything(0)
    measure = Measure()
    model = Stack(args.width, args.depth, meta)
    trainer = Trainer(strategy=strategy, accelerator=args.accelerator, devices=args.devices, max_steps=args.steps,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, callbacks=[measure])
    width, per_rank = args.width, args.batch

    def loader():
        g = torch.Generator().manual_seed(1)
        n = per_rank * args.devices * args.steps
        return DataLoader(TensorDataset(torch.randn(n, width, generator=g), torch.randn(n, width, generator=g)),
                          batch_size=per_rank)

    trainer.fit(model, loader)
    return measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--accelerator", default="cpu", choices=("cpu", "cuda"),
                        help="cuda: one GPU per rank, nccl; peak = torch.cuda.max_memory_allocated (not run here yet)")
    parser.add_argument("--quick", action="store_true", help="a small model and 4 steps: checks that it runs")
    args = parser.parse_args()
    if args.quick:
        args.width, args.depth, args.steps, args.warmup = 256, 4, 4, 1
    unwind_on_signals()
    out = Report("fsdp")
    model_mib = args.depth * (args.width * args.width + args.width) * 4 / 2**20
    out(f"# FSDP2 vs DDP on CPU: {args.depth} x Linear({args.width}, {args.width}) = {model_mib:.0f} MiB fp32, "
        f"AdamW, {args.devices} ranks ({'nccl' if args.accelerator == 'cuda' else 'gloo'}), {args.batch} samples/rank/step, {args.steps} steps "
        f"(first {args.warmup} not timed); cores: {os.cpu_count()}")
    medians = {}
    for case, strategy, meta in (("ddp", "ddp", False),
                                 ("fsdp", FSDPStrategy(auto_wrap_policy={Block}), True)):
        m = run(strategy, args, meta)
        step_ms = statistics.median(m.step_s[args.warmup:] or m.step_s) * 1000
        peak = statistics.median(m.peaks_mib)
        medians[case] = (step_ms, peak)
        out(f"{case:5s} step median {step_ms:8.1f} ms   peak resident growth per rank (MiB) "
            f"{', '.join(f'{p:.0f}' for p in m.peaks_mib)}   parameters per rank (MiB) "
            f"{', '.join(f'{p:.1f}' for p in m.local_param_mib)}")
        out.result(case, step_median_ms=step_ms, peak_rank_mib=peak, params_rank_mib=max(m.local_param_mib),
                   model_mib=model_mib, devices=args.devices)
    (d_ms, d_peak), (f_ms, f_peak) = medians["ddp"], medians["fsdp"]
    out(f"ratios fsdp/ddp: step time {f_ms / d_ms:.2f}x, peak memory per rank {f_peak / d_peak:.2f}x")
    out.result("ratio", step_time=f_ms / d_ms, peak_memory=f_peak / d_peak)
    print(f"written to {write_results(out.lines, 'fsdp.txt')}")


if __name__ == "__main__":
    main()
