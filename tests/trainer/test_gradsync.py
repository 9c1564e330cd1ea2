"""Two-level gradient sync equals a flat all-reduce on a 2 machines x 2 processes gloo job."""

from __future__ import annotations

import torch

from gpulayer.trainer.launcher import run_ranks


def _grads(grad_sync: str) -> list[torch.Tensor]:
    import os

    import torch.distributed as dist
    from torch import nn

    from gpulayer.trainer import gradsync

    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0001)  # several buckets
        installed = gradsync.register(ddp, grad_sync)
        assert installed == (grad_sync == "auto"), (grad_sync, os.environ["GROUP_WORLD_SIZE"])
        g = torch.Generator().manual_seed(100 + rank)  # different data on every rank
        x, y = torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)
        nn.functional.mse_loss(ddp(x), y).backward()
        return [p.grad.clone() for p in model.parameters()]
    finally:
        dist.destroy_process_group()


def _reference() -> list[torch.Tensor]:
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    total = None
    for rank in range(4):
        model.zero_grad()
        g = torch.Generator().manual_seed(100 + rank)
        x, y = torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)
        nn.functional.mse_loss(model(x), y).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        total = grads if total is None else [a + b for a, b in zip(total, grads)]
    return [t / 4 for t in total]


def test_two_level_hook_matches_flat_all_reduce_on_two_machines_of_two():
    two_level = run_ranks(_grads, ("auto",), nodes=2, procs_per_node=2, timeout_s=120)  # auto picks two-level
    flat = run_ranks(_grads, ("flat",), nodes=2, procs_per_node=2, timeout_s=120)
    expected = _reference()
    for rank in range(4):
        for a, b, e in zip(two_level[rank], flat[rank], expected):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_auto_keeps_flat_sync_on_one_machine(monkeypatch):
    from gpulayer.trainer.gradsync import wants_two_level

    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert not wants_two_level("auto", "gloo")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    assert wants_two_level("auto", "gloo")
    assert not wants_two_level("auto", "nccl")
    assert not wants_two_level("flat", "gloo")
    assert wants_two_level("two_level", "nccl")
