"""Shared-memory and two-level gradient sync equal a flat all-reduce (one machine, and 2 machines x 2 processes)."""

from __future__ import annotations

import pytest
import torch

from gpulayer.trainer.launcher import run_ranks


def _grads(grad_sync: str, slot_bytes: int = 0, steps: int = 1) -> tuple[str, list[torch.Tensor]]:
    import torch.distributed as dist
    from torch import nn

    from gpulayer.trainer import gradsync, shmreduce

    if slot_bytes:
        shmreduce.MAX_SLOT_BYTES = slot_bytes  # buckets bigger than a slot go through in pieces
    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0001)  # several buckets
        state = gradsync.register(ddp, grad_sync)
        g = torch.Generator().manual_seed(100 + rank)  # different data on every rank
        x, y = torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)
        for _ in range(steps):  # the same gradients each time: a barrier out of step would mix slots
            model.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
        name = state.name if state is not None else "flat"
        if state is not None:
            state.close()
        return name, [p.grad.clone() for p in model.parameters()]
    finally:
        dist.destroy_process_group()


def _reference(world: int = 4) -> list[torch.Tensor]:
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    total = None
    for rank in range(world):
        model.zero_grad()
        g = torch.Generator().manual_seed(100 + rank)
        x, y = torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)
        nn.functional.mse_loss(model(x), y).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        total = grads if total is None else [a + b for a, b in zip(total, grads)]
    return [t / world for t in total]


def test_two_level_hook_matches_flat_all_reduce_on_two_machines_of_two():
    two_level = run_ranks(_grads, ("auto",), nodes=2, procs_per_node=2, timeout_s=120)  # auto picks two-level
    flat = run_ranks(_grads, ("flat",), nodes=2, procs_per_node=2, timeout_s=120)
    expected = _reference()
    for rank in range(4):
        assert two_level[rank][0] == "two_level" and flat[rank][0] == "flat"
        for a, b, e in zip(two_level[rank][1], flat[rank][1], expected):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_shared_memory_sync_on_one_machine_matches_flat_and_keeps_replicas_identical():
    # three processes (a barrier byte can arrive a barrier early), pieces smaller than a bucket, many steps
    shm = run_ranks(_grads, ("auto", 64, 20), nodes=1, procs_per_node=3, timeout_s=120)
    flat = run_ranks(_grads, ("flat", 0, 20), nodes=1, procs_per_node=3, timeout_s=120)
    expected = _reference(3)
    for rank in range(3):
        assert shm[rank][0] == "shared_memory" and flat[rank][0] == "flat"
        for a, b, e, a0 in zip(shm[rank][1], flat[rank][1], expected, shm[0][1]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
            assert torch.equal(a, a0)  # every rank sums in the same order: bit-identical replicas


def _many_reduces(n: int, full_sum_bytes: int) -> list[float]:
    import torch.distributed as dist

    from gpulayer.trainer import shmreduce
    from gpulayer.trainer.shmreduce import ShmReducer

    shmreduce.FULL_SUM_BYTES = full_sum_bytes  # 0: always the chunked sum with its second barrier
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        red = ShmReducer.create(dist.group.WORLD, list(range(world)), 4 * 1000)
        out = []
        for i in range(n):  # uneven work per rank so the ranks drift against each other
            t = torch.full((1000 + i % 7,), float(rank + i))
            if rank == i % world:
                sum(range(2000))
            red.all_reduce_(t)
            assert bool((t == t[0]).all()), "a slot was read while a peer rewrote it"
            out.append(float(t[0]))
        red.close()
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("full_sum_bytes", [0, 1 << 20])
def test_shared_memory_reducer_stays_in_step_over_many_calls(full_sum_bytes):
    results = run_ranks(_many_reduces, (300, full_sum_bytes), nodes=1, procs_per_node=3, timeout_s=120)
    expected = [float(sum(r + i for r in range(3))) for i in range(300)]
    assert results == [expected] * 3


def test_auto_uses_the_machine_level_sum_wherever_machines_hold_several_processes(monkeypatch):
    from gpulayer.trainer.gradsync import wants_two_level

    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert wants_two_level("auto", "gloo")  # one machine: the shared-memory sum alone
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert not wants_two_level("auto", "gloo")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert wants_two_level("auto", "gloo")
    assert not wants_two_level("auto", "nccl")
    assert not wants_two_level("flat", "gloo")
    assert wants_two_level("two_level", "nccl")
