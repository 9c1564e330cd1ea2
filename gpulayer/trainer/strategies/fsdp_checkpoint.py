"""Checkpoints of a sharded module: a ``torch.distributed.checkpoint`` directory, or one full file from rank 0.

``state_dict_type="sharded"`` (``ModelParallelStrategy``'s default): the
checkpoint path is a directory. Every rank writes its own shards of the weights
and of each optimizer's state through ``torch.distributed.checkpoint`` (DCP), and
global rank 0 writes the rest of the checkpoint (counters, loops, callbacks,
schedulers, RNG: everything ``checkpoint.dump`` builds) to ``meta.pt`` beside them.
DCP records each tensor's global shape, so a directory written by 2 ranks loads
into 4 (or into one process): each rank reads the pieces its new shards cover.

``state_dict_type="full"`` (``FSDPStrategy``'s default, as in Lightning): the
weights and optimizer states are gathered to rank 0 (on the CPU) and written as
one ordinary checkpoint file, which a plain ``Trainer`` or
``Module.load_from_checkpoint`` reads. Optimizer states are keyed by parameter
name there (``torch.distributed.checkpoint.state_dict``'s full form).

Loading, as the Trainer orders a resume: the weights before the module is
sharded (or into the shards ``configure_model`` made), the optimizers' states
after ``configure_optimizers``; both forms load at any world size.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gpulayer.trainer import checkpoint
from gpulayer.trainer.checkpoint import META_FILE, SHARDED_OPTIMIZER_COUNT, ShardedOptimizerState, sharded_record
from gpulayer.trainer.errors import CheckpointNotFound


def _options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(**kw)


def full_model_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The whole module's weights on global rank 0, on the CPU (``{}`` on the other ranks). Collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    return get_model_state_dict(module, options=_options(full_state_dict=True, cpu_offload=True))


def save(strategy: Any, ckpt: dict[str, Any], path: str) -> None:
    """Write ``ckpt`` (built by ``checkpoint.dump`` on every rank) in the strategy's form. Collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    module = strategy.lightning_module
    optimizers = strategy._trainer.optimizers if "optimizer_states" in ckpt else []
    if strategy.sharding_plan.state_dict_type == "full":
        full = _options(full_state_dict=True, cpu_offload=True)
        ckpt = {**ckpt, "state_dict": get_model_state_dict(module, options=full)}
        if optimizers:
            ckpt["optimizer_states"] = [get_optimizer_state_dict(module, o, options=full) for o in optimizers]
        if strategy.is_global_zero:
            checkpoint.save(ckpt, path)
        return
    import torch.distributed.checkpoint as dcp

    shards: dict[str, Any] = {"state_dict": get_model_state_dict(module)}
    for i, opt in enumerate(optimizers):
        shards[f"optimizer_{i}"] = get_optimizer_state_dict(module, opt)
    if strategy.is_global_zero:
        if os.path.isfile(path):
            os.remove(path)  # an older single-file checkpoint under the same name
        os.makedirs(path, exist_ok=True)
    dist.barrier()
    dcp.save(shards, checkpoint_id=path)
    if strategy.is_global_zero:
        rest = {k: v for k, v in ckpt.items() if k not in ("state_dict", "optimizer_states")}
        rest[SHARDED_OPTIMIZER_COUNT] = len(optimizers)
        checkpoint.save(rest, os.path.join(path, META_FILE))
    dist.barrier()  # the directory is whole before any rank goes on (and may read it)


def load(strategy: Any, path: str) -> dict[str, Any]:
    """A checkpoint to resume from: a sharded directory (read here at this world size) or a single file."""
    if not os.path.isdir(path):
        ckpt = checkpoint.load(path)
        _as_shards(strategy.lightning_module, ckpt.get("state_dict") or {})
        return ckpt
    meta_path = os.path.join(path, META_FILE)
    if not os.path.isfile(meta_path):
        raise CheckpointNotFound(f"{path!r} is a directory without {META_FILE}: not a sharded checkpoint that "
                                 "gpulayer wrote (pass the directory ModelCheckpoint or save_checkpoint made)")
    import torch.distributed.checkpoint as dcp

    ckpt = sharded_record(path)
    # the shapes to read into: the module as it is now (whole, or already sharded by configure_model)
    target = {"state_dict": {k: v.detach().clone() for k, v in strategy.lightning_module.state_dict().items()}}
    dcp.load(target, checkpoint_id=path)
    ckpt["state_dict"] = target["state_dict"]
    return ckpt


def _as_shards(module: nn.Module, weights: dict[str, Any]) -> None:
    """Full weights cut to this rank's shards where ``configure_model`` already sharded the module (in place)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for name, live in module.state_dict().items():
        if isinstance(live, DTensor) and name in weights and not isinstance(weights[name], DTensor):
            # every rank read the whole file: each cuts its own piece, nothing is sent
            weights[name] = distribute_tensor(weights[name].to(live.device), live.device_mesh, live.placements,
                                              src_data_rank=None)


def load_optimizer(strategy: Any, optimizer: Any, state: Any) -> None:
    """Put a saved state into ``optimizer`` (whose parameters are the sharded module's)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    module = strategy.lightning_module
    if isinstance(state, ShardedOptimizerState):
        import torch.distributed.checkpoint as dcp

        target = get_optimizer_state_dict(module, optimizer)  # this world's shards, with the state's shapes
        wrapped = {f"optimizer_{state.index}": target}
        dcp.load(wrapped, checkpoint_id=state.path)
        set_optimizer_state_dict(module, optimizer, wrapped[f"optimizer_{state.index}"])
        return
    set_optimizer_state_dict(module, optimizer, _by_name(module, optimizer, state),
                             options=_options(full_state_dict=True))


def _by_name(module: nn.Module, optimizer: Any, state: dict[str, Any]) -> dict[str, Any]:
    """A state keyed by parameter position (``optimizer.state_dict()``, a DDP or single-device checkpoint) keyed by
    parameter name instead, as the full form is; a state keyed by name passes through."""
    if not state.get("state") and not state.get("param_groups"):
        return state
    groups = state["param_groups"]
    if not groups or not groups[0]["params"] or isinstance(groups[0]["params"][0], str):
        return state
    name_of = {id(p): n for n, p in module.named_parameters()}
    names = {}
    for saved, live in zip(groups, optimizer.param_groups):
        for index, param in zip(saved["params"], live["params"]):
            names[index] = name_of[id(param)]
    return {"state": {names[i]: s for i, s in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in groups]}


def remove(path: str) -> None:
    """A checkpoint of either form, gone (ModelCheckpoint's ``save_top_k`` replacing an older one)."""
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.isfile(path):
        os.remove(path)
