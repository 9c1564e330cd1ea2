"""Two-level gradient sync for gloo: sum inside each machine, then once across machines.

A flat all-reduce over N machines x M processes sends every gradient over the
network from every process. Here each machine first sums its M processes'
gradients into its local rank 0 (shared memory, cheap), the local rank 0s
all-reduce among themselves (one participant per machine on the network), and
each machine broadcasts the sum back to its processes. Dividing by the world
size gives DDP's average. NCCL already does topology-aware rings: it keeps plain DDP.

The hook runs its three collectives synchronously, which is simple and right for
gloo on CPU; it returns a completed future as DDP's comm-hook API requires.
"""

# no `from __future__ import annotations`: DDP checks the hook's annotations as real objects
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class TwoLevelState:
    """Process groups one rank needs for the two-level hook."""

    intra_group: Any        # this machine's processes
    inter_group: Any        # the local rank 0s of every machine (None where this rank is not one)
    local_leader: int       # global rank of this machine's local rank 0
    is_leader: bool
    world_size: int


def topology() -> "tuple[int, int]":
    """(machines, processes per machine) from torchrun's environment."""
    return int(os.environ.get("GROUP_WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def wants_two_level(grad_sync: str, backend: str) -> bool:
    """``auto``: on gloo with several machines of several processes; ``two_level``: always; ``flat``: never."""
    if grad_sync == "flat":
        return False
    if grad_sync == "two_level":
        return True
    nodes, per_node = topology()
    return backend == "gloo" and nodes > 1 and per_node > 1


def build_state() -> TwoLevelState:
    """Create the groups. Every rank must call this (``new_group`` is collective, same order everywhere)."""
    world = dist.get_world_size()
    rank = dist.get_rank()
    nodes, per_node = topology()
    if nodes * per_node != world:
        raise RuntimeError(
            f"GROUP_WORLD_SIZE x LOCAL_WORLD_SIZE = {nodes} x {per_node} does not match the world size {world}; "
            "launch with torchrun's environment (gpulayer.launch.rank_env) or use grad_sync='flat'"
        )
    node = rank // per_node
    intra = None
    for n in range(nodes):
        group = dist.new_group(ranks=list(range(n * per_node, (n + 1) * per_node)))
        if n == node:
            intra = group
    leaders = [n * per_node for n in range(nodes)]
    inter = dist.new_group(ranks=leaders)
    leader = node * per_node
    return TwoLevelState(intra, inter if rank == leader else None, leader, rank == leader, world)


def two_level_hook(state: TwoLevelState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: reduce in the machine, all-reduce across machine leaders, broadcast back, average."""
    tensor = bucket.buffer()
    dist.reduce(tensor, dst=state.local_leader, group=state.intra_group)
    if state.is_leader:
        dist.all_reduce(tensor, group=state.inter_group)
    dist.broadcast(tensor, src=state.local_leader, group=state.intra_group)
    tensor.div_(state.world_size)
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def register(ddp_model: torch.nn.parallel.DistributedDataParallel, grad_sync: str) -> bool:
    """Install the two-level hook on ``ddp_model`` when ``grad_sync`` and the topology call for it."""
    if not wants_two_level(grad_sync, dist.get_backend()):
        return False
    ddp_model.register_comm_hook(build_state(), two_level_hook)
    return True
