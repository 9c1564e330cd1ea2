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


def _options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(**kw)


def full_model_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The whole module's weights on global rank 0, on the CPU (``{}`` on the other ranks). Collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    return get_model_state_dict(module, options=_options(full_state_dict=True, cpu_offload=True))


def is_sharded(path: str) -> bool:
    """A directory holding ``meta.pt``: a sharded checkpoint (Lightning's ``_is_sharded_checkpoint`` rule)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, META_FILE))


def clear_for_file(path: str, is_global_zero: bool) -> None:
    """Make room for a single-file checkpoint at ``path``: a sharded directory there goes (rank 0), any other
    directory is refused."""
    if os.path.isdir(path) and not is_sharded(path):
        raise IsADirectoryError(f"The checkpoint path exists and is a directory: {path}")
    if is_global_zero and is_sharded(path):
        shutil.rmtree(path)


def model_key(strategy: Any) -> str:
    """The key of the weights inside a sharded directory: Lightning's FSDPStrategy writes ``"model"``, its
    ModelParallelStrategy ``"state_dict"``; each reads the other's."""
    return "model" if strategy.sharding_plan.kind == "fsdp" else "state_dict"


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
        clear_for_file(path, strategy.is_global_zero)
        if strategy.is_global_zero:
            strategy.checkpoint_io.save_checkpoint(ckpt, path)
        return
    import torch.distributed.checkpoint as dcp

    shards: dict[str, Any] = {model_key(strategy): get_model_state_dict(module)}
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


def load(strategy: Any, path: str, weights_only: bool | None = None) -> dict[str, Any]:
    """A checkpoint to resume from: a sharded directory (read here at this world size) or a single file."""
    if os.path.isdir(path) and not is_sharded(path):
        raise ValueError(f"The path {path!r} does not point to a valid checkpoint. Make sure the path points to either "
                         f"a directory with FSDP checkpoint shards ({META_FILE} beside them), or a single file with a "
                         "full checkpoint.")
    if not os.path.isdir(path):
        ckpt = strategy.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        _as_shards(strategy.lightning_module, ckpt.get("state_dict") or {})
        return ckpt
    import torch.distributed.checkpoint as dcp

    ckpt = sharded_record(path)
    names = _saved_names(path)
    if "optimizer_states" not in ckpt and SHARDED_OPTIMIZER_COUNT not in ckpt:  # written by Lightning: count them
        count = len({n.split(".", 1)[0] for n in names if n.startswith("optimizer_")})
        if count:
            ckpt["optimizer_states"] = [ShardedOptimizerState(path, i) for i in range(count)]
    # the shapes to read into: the module as it is now (whole, or already sharded by configure_model)
    key = "model" if any(n.startswith("model.") for n in names) else "state_dict"
    target = {key: {k: v.detach().clone() for k, v in strategy.lightning_module.state_dict().items()}}
    dcp.load(target, checkpoint_id=path)
    ckpt["state_dict"] = target[key]
    return ckpt


def _saved_names(path: str) -> list[str]:
    """The flattened names of every tensor in a sharded directory (``model.layer.weight``, ``optimizer_0.state...``):
    which key the weights are under (``"model"`` or ``"state_dict"``) and how many optimizers there are."""
    from torch.distributed.checkpoint import FileSystemReader
    return list(FileSystemReader(path).read_metadata().state_dict_metadata)


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
