"""Gradient sync for gloo: sum inside each machine (shared memory), then once across machines.

A flat gloo all-reduce sends every gradient through TCP, even between two
processes of the same machine (over loopback). Here each machine first sums its
M processes' gradients through shared memory (``shmreduce.py``: a copy, a sum
and two barriers of one pipe byte each), the machine's local rank 0 all-reduces
that sum with the other machines' (one participant per machine on the network),
and the machine's processes read the total back. Dividing by the world size
gives DDP's average. Where shared memory is not to be had, the in-machine level
falls back to gloo sub-groups (reduce to the local rank 0, broadcast back).
NCCL already does topology-aware rings: CUDA keeps plain DDP.

The hook runs synchronously, which is simple and right for CPU processes that
have no spare core to overlap communication with; it returns a completed future
as DDP's comm-hook API requires.
"""

# no `from __future__ import annotations`: DDP checks the hook's annotations as real objects
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from gpulayer.trainer.shmreduce import ShmReducer


@dataclass
class TwoLevelState:
    """What one rank needs for the hook: how its machine sums, and the group of the machines' leaders."""

    intra_group: Any              # this machine's processes
    inter_group: Any              # the local rank 0s of every machine (None where this rank is not one, or one machine)
    local_leader: int             # global rank of this machine's local rank 0
    is_leader: bool
    world_size: int
    machines: int = 1
    shm: Optional[ShmReducer] = None  # the machine's shared-memory reducer (None: gloo inside the machine too)

    @property
    def name(self) -> str:
        """What ``fit_info["grad_sync"]`` reports."""
        if self.machines == 1:
            return "shared_memory" if self.shm is not None else "flat"
        return "two_level"

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()
            self.shm = None


def topology() -> "tuple[int, int]":
    """(machines, processes per machine) from torchrun's environment."""
    return int(os.environ.get("GROUP_WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def wants_two_level(grad_sync: str, backend: str) -> bool:
    """``auto``: on gloo when machines hold several processes; ``two_level``: always; ``flat``: never.

    On one machine "two-level" is the shared-memory sum alone (there is no second level).
    """
    if grad_sync == "flat":
        return False
    if grad_sync == "two_level":
        return True
    nodes, per_node = topology()
    return backend == "gloo" and per_node > 1


def build_state(grad_bytes: int = 1 << 20, timeout_s: float = 1800.0, shared_memory: bool = True) -> TwoLevelState:
    """Create the groups (and the shared memory). Every rank must call this (collective, same order everywhere).

    ``grad_bytes``: the largest bucket's size (the shared slots need not be bigger).
    """
    world = dist.get_world_size()
    rank = dist.get_rank()
    nodes, per_node = topology()
    if nodes * per_node != world:
        raise RuntimeError(
            f"GROUP_WORLD_SIZE x LOCAL_WORLD_SIZE = {nodes} x {per_node} does not match the world size {world}; "
            "launch with torchrun's environment (gpulayer.procs.env.rank_env) or use grad_sync='flat'"
        )
    node = rank // per_node
    intra, intra_ranks = None, []
    for n in range(nodes):
        ranks = list(range(n * per_node, (n + 1) * per_node))
        group = dist.new_group(ranks=ranks) if nodes > 1 else dist.group.WORLD
        if n == node:
            intra, intra_ranks = group, ranks
    leaders = [n * per_node for n in range(nodes)]
    inter = dist.new_group(ranks=leaders) if nodes > 1 else None
    leader = node * per_node
    shm = ShmReducer.create(intra, intra_ranks, grad_bytes, timeout_s) if shared_memory and per_node > 1 else None
    return TwoLevelState(intra, inter if rank == leader else None, leader, rank == leader, world, nodes, shm)


def two_level_hook(state: TwoLevelState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: sum in the machine, all-reduce across machine leaders, share back, average."""
    tensor = bucket.buffer()
    if state.shm is not None:
        # on several machines every process of a machine waits while its leader talks to the other machines
        between = (lambda t: dist.all_reduce(t, group=state.inter_group)) if state.machines > 1 else None
        state.shm.all_reduce_(tensor, between=between)
    else:
        dist.reduce(tensor, dst=state.local_leader, group=state.intra_group)
        if state.is_leader and state.machines > 1:
            dist.all_reduce(tensor, group=state.inter_group)
        dist.broadcast(tensor, src=state.local_leader, group=state.intra_group)
    tensor.div_(state.world_size)
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def register(ddp_model: torch.nn.parallel.DistributedDataParallel, grad_sync: str,
             timeout_s: float = 1800.0) -> "TwoLevelState | None":
    """Install the hook on ``ddp_model`` when ``grad_sync``, the backend and the topology call for it.

    Returns the state (``state.name`` says which sync runs; ``close()`` it at teardown), or None for plain DDP.
    """
    if not wants_two_level(grad_sync, dist.get_backend()):
        return None
    on_cpu = all(p.device.type == "cpu" for p in ddp_model.parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in ddp_model.parameters() if p.requires_grad)
    state = build_state(grad_bytes, timeout_s, shared_memory=on_cpu)
    if state.shm is None and state.machines == 1:
        return None  # one machine without shared memory: the backend's own all-reduce is as good
    ddp_model.register_comm_hook(state, two_level_hook)
    return state
