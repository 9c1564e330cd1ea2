"""One training job of the scaling runs: a small CNN on synthetic images, 2 epochs, global batch 256.

The same module runs under both trainers; only the imports differ.

Lightning 2.6.6, one ``torchrun`` per machine, as Lightning's multi-node documentation describes::

    ip netns exec NS torchrun --nnodes N --nproc-per-node 2 --node-rank I --master-addr ADDR0 --master-port P \\
        scaling_run.py --framework lightning --machines N --stats FILE

gpulayer, once, from a client in the root namespace (the fit submits itself to the cluster that
``GPULAYER_BROKER_URL`` / ``GPULAYER_SECRET`` name)::

    scaling_run.py --framework gpulayer --machines N --grad-sync two_level --workers m1,m2 --stats FILE

Rank 0 writes ``FILE`` (JSON) at the end of training, for both: the time of the first and of the last
training step, the step count, its last logged loss, and the loss of the trained model on a fixed set of
``EVAL_IMAGES`` images drawn the same way (the same definition on both sides). The gpulayer client also prints one
``client {...}`` line: how long ``fit()`` took in the caller and what the fit reported (placement, grad sync).

Data: ``--images`` synthetic 3x32x32 images in 10 classes (a class template plus noise, seed 0), built
in every process; each process's batch is 256 / (2 N). Model: 2 conv layers (16 and 32 channels, 3x3,
each followed by a 2x2 max-pool) and a linear layer, 25,578 parameters (100 KB of gradients: the
all-reduce is latency-bound, not bandwidth-bound); ``--hidden 1024`` adds a hidden layer (2.1 M
parameters, 8.4 MB of gradients: bandwidth-bound across regions). SGD with momentum, lr 0.05.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

GLOBAL_BATCH = 256
DEVICES = 2  # processes per machine
EPOCHS = 2
EVAL_IMAGES = 1024
SEED = 0


def build_net(hidden: int = 0) -> nn.Sequential:
    """2 conv layers and a linear classifier; ``hidden`` > 0 puts a hidden layer of that width before it
    (``hidden=1024``: 2.1 M parameters, 8.4 MB of gradients per step instead of 100 KB)."""
    head = [nn.Linear(32 * 8 * 8, hidden), nn.ReLU(), nn.Linear(hidden, 10)] if hidden else [nn.Linear(32 * 8 * 8, 10)]
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), *head,
    )


def parameter_count(hidden: int = 0) -> int:
    return sum(p.numel() for p in build_net(hidden).parameters())


def synthetic_images(n: int) -> TensorDataset:
    """``n`` images: one of 10 fixed templates plus twice as much noise, labelled by the template (seed 0)."""
    g = torch.Generator().manual_seed(SEED)
    templates = torch.randn(10, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    x = 0.5 * templates[y] + torch.randn(n, 3, 32, 32, generator=g)
    return TensorDataset(x, y)


class CNNBody:
    """Mixed into each framework's ``LightningModule``: the same model, data, optimizer and hooks for both."""

    def __init__(self, images: int, batch_per_process: int, stats_path: str | None = None, hidden: int = 0):
        super().__init__()
        self.images, self.batch_per_process, self.stats_path = images, batch_per_process, stats_path
        self.net = build_net(hidden)
        self.first_step_at: float | None = None
        self.steps = 0

    def training_step(self, batch, batch_idx):
        if self.first_step_at is None:
            self.first_step_at = time.time()
        self.steps += 1
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def train_dataloader(self):
        # The trainer swaps in a DistributedSampler (use_distributed_sampler=True in both).
        return DataLoader(synthetic_images(self.images), batch_size=self.batch_per_process, shuffle=True,
                          drop_last=True)

    def on_train_end(self):
        if self.global_rank != 0 or not self.stats_path:
            return
        end = time.time()
        last = self.trainer.callback_metrics.get("loss")
        stats = {"first_step_at": self.first_step_at, "last_step_at": end, "steps": self.steps,
                 "last_loss": None if last is None else float(last), "eval_loss": eval_loss(self.net)}
        with open(self.stats_path, "w") as f:
            json.dump(stats, f)


def eval_loss(net: nn.Module) -> float:
    """Cross-entropy of ``net`` on ``synthetic_images(EVAL_IMAGES)`` (the training data when ``--images`` is
    ``EVAL_IMAGES``, else images drawn the same way), without grad."""
    x, y = synthetic_images(EVAL_IMAGES).tensors
    was_training = net.training
    net.eval()
    with torch.no_grad():
        loss = nn.functional.cross_entropy(net(x), y).item()
    net.train(was_training)
    return loss


def module_class(framework: str) -> type:
    if framework == "lightning":
        from lightning.pytorch import LightningModule
    else:
        from gpulayer.trainer import LightningModule
    return type("ScalingCNN", (CNNBody, LightningModule), {})


def trainer_kwargs(machines: int) -> dict:
    """Lightning's arguments, the same for both trainers."""
    return dict(accelerator="cpu", num_nodes=machines, devices=DEVICES, strategy="ddp", max_epochs=EPOCHS,
                enable_checkpointing=False, logger=False, enable_progress_bar=False, enable_model_summary=False)


def batch_per_process(machines: int) -> int:
    world = machines * DEVICES
    if GLOBAL_BATCH % world:
        raise SystemExit(f"global batch {GLOBAL_BATCH} does not split over {world} processes")
    return GLOBAL_BATCH // world


def run_lightning(args: argparse.Namespace) -> None:
    """One rank under torchrun (its environment tells Lightning the rank and the world)."""
    import lightning.pytorch as pl

    pl.seed_everything(SEED, verbose=False)
    model = module_class("lightning")(args.images, batch_per_process(args.machines), args.stats, args.hidden)
    pl.Trainer(**trainer_kwargs(args.machines)).fit(model)


def run_gpulayer(args: argparse.Namespace) -> None:
    """The client: one ``fit`` that runs as machines x 2 ranks on the cluster, then one ``client`` line."""
    import gpulayer
    from gpulayer import Resources
    from gpulayer.trainer import Trainer, seed_everything

    gpulayer.init()
    seed_everything(SEED)
    model = module_class("gpulayer")(args.images, batch_per_process(args.machines), args.stats, args.hidden)
    pinned = Resources(worker_ids=args.workers.split(",")) if args.workers else None
    trainer = Trainer(**trainer_kwargs(args.machines), grad_sync=args.grad_sync, cluster_resources=pinned)
    t0 = time.perf_counter()
    trainer.fit(model)
    fit_s = time.perf_counter() - t0
    info = trainer.fit_info
    print("client " + json.dumps({"fit_s": fit_s, "placement": info.get("placement"), "workers": info.get("workers"),
                                  "grad_sync": info.get("grad_sync"), "world_size": info.get("world_size")}),
          flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--framework", choices=("lightning", "gpulayer"), required=True)
    p.add_argument("--machines", type=int, required=True, help="num_nodes (2 processes each)")
    p.add_argument("--images", type=int, default=4096, help="synthetic images in the data set (default 4096)")
    p.add_argument("--hidden", type=int, default=0, help="width of a hidden linear layer (default 0: none)")
    p.add_argument("--stats", help="where rank 0 writes its JSON stats at the end of training")
    p.add_argument("--grad-sync", default="auto", choices=("auto", "two_level", "flat"), help="gpulayer only")
    p.add_argument("--workers", default="", help="gpulayer only: comma-separated worker ids to pin the fit to")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    (run_lightning if args.framework == "lightning" else run_gpulayer)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
