"""``gpulayer demo``: the README's main job on the embedded cluster."""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

LEARNING_RATES = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)


def fit_line(lr: float, steps: int = 300, seed: int = 0) -> dict:
    """Fit y = 3x + 2 with SGD; one point of a learning-rate sweep."""
    import torch

    import gpulayer

    torch.manual_seed(seed)
    x = torch.randn(256, 1)
    y = 3 * x + 2 + 0.1 * torch.randn_like(x)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    w = gpulayer.current_worker()
    return {"lr": lr, "loss": loss.item(), "w": model.weight.item(), "b": model.bias.item(),
            "worker": w.id, "zone": w.zone}


def allreduce_ranks() -> dict:
    """Every rank of a 2 x 2 job adds up the rank numbers over gloo."""
    import os

    import torch
    import torch.distributed as dist

    import gpulayer

    gpulayer.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "sum": t.item(), "worker": os.environ["GPULAYER_WORKER_ID"]}


def run_demo() -> int:
    import gpulayer
    from gpulayer import JobRejected, Resources, submit, submit_batch
    from gpulayer.app import registry

    console = Console()
    console.rule("[bold]gpulayer demo")
    t0 = time.monotonic()
    console.print("connecting: GPULAYER_BROKER_URL, else a running `gpulayer up`, else a new embedded cluster ...")
    gpulayer.init()
    workers = registry().snapshot()
    console.print(f"ready in {time.monotonic() - t0:.1f}s: {len(workers)} workers "
                  f"({', '.join(w.describe() for w in workers)})")

    console.rule("1. a learning-rate sweep, one job per point, sent as one batch")
    t1 = time.monotonic()
    sweep = submit_batch([submit.s(fit_line, lr) for lr in LEARNING_RATES])
    results = sweep.get(timeout=600)
    table = Table()
    for col in ("lr", "final loss", "w (3.0)", "b (2.0)", "ran on", "zone"):
        table.add_column(col)
    for r in results:
        table.add_row(f"{r['lr']:g}", f"{r['loss']:.4f}", f"{r['w']:.3f}", f"{r['b']:.3f}", r["worker"], r["zone"])
    console.print(table)
    best = min(results, key=lambda r: r["loss"])
    console.print(f"{len(results)} jobs in {time.monotonic() - t1:.1f}s; best lr {best['lr']:g} "
                  f"(loss {best['loss']:.4f})")

    console.rule("2. routing by capability")
    zone = workers[-1].zone
    if zone:
        r = submit.delay(fit_line, 0.1, resources=Resources(zone=zone)).get(timeout=300)
        console.print(f"Resources(zone={zone!r}) ran on {r['worker']} in zone {r['zone']}")
    try:
        submit.delay(fit_line, 0.1, resources=Resources(cuda=True))
        console.print("Resources(cuda=True) was accepted: this cluster has a GPU worker")
    except JobRejected as err:
        console.print(f"Resources(cuda=True) refused at once: [yellow]{err}[/]")
    console.rule("3. a distributed job: 2 workers x 2 processes, all slots reserved at once")
    t3 = time.monotonic()
    job = gpulayer.distributed(allreduce_ranks, nodes=2, procs_per_node=2)
    console.print(f"placement: {job.placement}")
    ranks = job.get(timeout=300)
    for r in ranks:
        console.print(f"  rank {r['rank']} on {r['worker']}: all_reduce(sum of ranks) = {r['sum']:g}")
    console.print(f"done in {time.monotonic() - t3:.1f}s (expected sum 0+1+2+3 = 6)")

    console.rule("4. the Trainer: one process, then DDP with devices=2")
    from gpulayer.trainer.demo import run_training_demo

    run_training_demo(console.print)
    console.rule(f"done in {time.monotonic() - t0:.1f}s")
    return 0
