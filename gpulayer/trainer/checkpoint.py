"""Checkpoint contents, in Lightning's format so a file moves both ways between gpulayer and Lightning 2.6.

The keys are Lightning's: ``epoch``, ``global_step``, ``pytorch-lightning_version``,
``state_dict``, ``loops`` (its progress counters: ``checkpoint_loops.py``),
``callbacks`` (by ``state_key``), ``optimizer_states``, ``lr_schedulers``, the AMP
scaler under ``MixedPrecision``, ``hparams_name`` / ``hyper_parameters`` and the
datamodule's: the same top-level keys as Lightning's. What only gpulayer reads sits among the stateful
components' entries, ``callbacks["gpulayer"]`` of a full checkpoint (Lightning gives each callback only its
own entry): the exact
position inside the epoch, the fit id of a cluster fit, and two sets of RNG states
(at the epoch start, to rebuild the same shuffled order; at the save, to continue
dropout and friends with the same numbers), which make a resume exact.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from gpulayer.trainer import checkpoint_loops, loader_state
from gpulayer.trainer.errors import CheckpointNotFound, TrainerError
from gpulayer.trainer.plugins.io.torch_io import TorchCheckpointIO
from gpulayer.trainer.plugins.precision.amp import MixedPrecision
from gpulayer.trainer.seed import capture_rng
from gpulayer.trainer.stage_aids import profile_hook

FORMAT_VERSION = 2
GPULAYER_KEY = "gpulayer"
LIGHTNING_FORMAT_VERSION = "2.6.6"  # the Lightning release whose checkpoint format this follows
SCALER_KEY = "MixedPrecision"       # Lightning's key for the loss scaler: its precision plugin's class name
_LEGACY_SCALER_KEY = "native_amp_scaling_state"


def _phase(trainer) -> tuple[str, int, int]:
    """(where the fit is, its epoch, batches done in that epoch) at this save."""
    loop = trainer.loop
    if loop is None or trainer.state_stage != "fit":
        # an epoch cut short (max_steps, should_stop) has been counted, as in Lightning: its batches are kept
        return checkpoint_loops.BETWEEN, trainer.current_epoch, 0 if loop is None or loop.epoch_done else loop.batches_done
    context = getattr(trainer.metric_store, "context", None)
    in_validation = isinstance(context, tuple) and len(context) == 3 and context[2] == "val"
    if in_validation:
        return checkpoint_loops.VALIDATION, trainer.current_epoch, loop.batches_done
    if not loop.epoch_done:  # inside the epoch, or after it was cut short (the counter moved on): the epoch run
        return checkpoint_loops.BATCH_END, loop.epoch, loop.batches_done
    if context == getattr(trainer.metric_store, "TRAIN_EPOCH", None):
        return checkpoint_loops.EPOCH_END, trainer.current_epoch, loop.batches_done
    return checkpoint_loops.BETWEEN, trainer.current_epoch, 0  # the epoch counter already moved on


def _lightning_loops(trainer, phase: str, epoch: int, batches_done: int) -> dict[str, Any]:
    loop, module, cfg = trainer.loop, trainer.lightning_module, trainer.config
    per_epoch = loop.num_train_batches if loop is not None else batches_done
    accumulate = cfg.accumulate_grad_batches
    stepped = batches_done % accumulate == 0 or batches_done >= per_epoch
    return checkpoint_loops.to_lightning(
        phase=phase, epoch=epoch, batches_done=batches_done, batches_per_epoch=per_epoch,
        global_step=trainer.global_step, batches_stepped=trainer.batches_stepped, stepped_this_batch=stepped,
        manual=not module.automatic_optimization, val_batches=_finite_total(trainer.num_val_batches),
        val_ran=trainer.val_has_run, accumulate=accumulate)


def _finite_total(counts: list[float] | None) -> int:
    """How many batches a validation run has; an infinite loader counts 0 (Lightning would count what ran)."""
    total = sum(counts or [0])
    return int(total) if total != float("inf") else 0


def _hparams_entries(obj: Any, ckpt: dict[str, Any]) -> None:
    hparams = getattr(obj, "hparams", None) if obj is not None else None
    if not hparams:
        return
    if hasattr(obj, "_hparams_name"):
        ckpt[obj.CHECKPOINT_HYPER_PARAMS_NAME] = obj._hparams_name
    if isinstance(hparams, dict):
        ckpt[obj.CHECKPOINT_HYPER_PARAMS_KEY] = dict(hparams)
    else:  # an OmegaConf container is kept as itself, with its type, as Lightning does
        ckpt[obj.CHECKPOINT_HYPER_PARAMS_KEY] = hparams
        ckpt[obj.CHECKPOINT_HYPER_PARAMS_TYPE] = type(hparams)


def dump(trainer, weights_only: bool = False) -> dict[str, Any]:
    module = trainer.lightning_module
    loop = trainer.loop
    phase, epoch, batches_done = _phase(trainer)
    ckpt: dict[str, Any] = {
        "epoch": trainer.current_epoch,
        "global_step": trainer.global_step,
        "pytorch-lightning_version": LIGHTNING_FORMAT_VERSION,
        "state_dict": module.state_dict(),
        "loops": _lightning_loops(trainer, phase, epoch, batches_done),
    }
    loader_states = loader_state.state_dicts(trainer.loaders.train)
    if loader_states:  # Lightning's place for them: the fit loop's own state
        ckpt["loops"]["fit_loop"]["state_dict"][loader_state.KEY] = loader_states
    if phase == checkpoint_loops.BETWEEN and (loop is None or loop.epoch_done):
        own_epoch, own_batches, own_done = max(epoch - 1, 0), 0, epoch > 0  # the counter moved past the last epoch
    else:
        own_epoch, own_batches, own_done = loop.epoch, loop.batches_done, loop.epoch_done
    own: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "epoch": own_epoch,
        "batches_done": own_batches,
        "epoch_done": own_done,
        "phase": phase,
        "batches_stepped": trainer.batches_stepped,
    }
    if trainer.fit_id is not None:
        own["fit_id"] = trainer.fit_id
    if not weights_only:
        # only callbacks with a state, as Lightning saves them (the progress bar has none)
        ckpt["callbacks"] = {cb.state_key: state for cb in trainer.callbacks if (state := cb.state_dict())}
        ckpt["optimizer_states"] = [o.state_dict() for o in trainer.optimizers]
        ckpt["lr_schedulers"] = [c.scheduler.state_dict() for c in trainer.lr_scheduler_configs]
        plugin = trainer.precision_plugin
        plugin_state = plugin.state_dict() if plugin is not None else None
        if plugin_state:  # under the plugin's class name, as Lightning keeps it (a loss scaler's state)
            ckpt[type(plugin).__qualname__] = plugin_state
        own["rng"] = _plain_rng(capture_rng())
        own["epoch_rng"] = _plain_rng(loop.epoch_start_rng) if loop is not None else None
        own["train_metric_acc"] = trainer.metric_store.export_acc("train")
    for obj in (module, trainer.datamodule):
        _hparams_entries(obj, ckpt)
    datamodule = trainer.datamodule
    if datamodule is not None and hasattr(datamodule, "state_dict"):
        with profile_hook(trainer, datamodule, "state_dict"):
            dm_state = datamodule.state_dict()
        if dm_state:
            ckpt[type(datamodule).__qualname__] = dm_state
    if not weights_only:  # a weights-only file resumes nothing
        ckpt["callbacks"][GPULAYER_KEY] = own
    hooks = trainer.hooks
    if hooks is None:  # outside a run (a module only connected to the strategy): the hooks it would have
        from gpulayer.trainer.hooks import Hooks
        hooks = Hooks(trainer, module, trainer.callbacks, trainer.datamodule)
    hooks.call("on_save_checkpoint", ckpt)
    return ckpt


def save(ckpt: dict[str, Any], path: str) -> None:
    """Write atomically: a crash mid-write never leaves a truncated checkpoint under ``path`` (``TorchCheckpointIO``)."""
    TorchCheckpointIO().save_checkpoint(ckpt, path)


def load(path: str) -> dict[str, Any]:
    return TorchCheckpointIO().load_checkpoint(path)


def _plain_rng(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """The generators' states as lists of ints: plain values, which any tool can compare and
    ``torch.load(weights_only=True)`` reads."""
    if state is None:
        return None
    plain = dict(state)
    plain["torch"] = state["torch"].tolist()
    if "cuda" in state:
        plain["cuda"] = [s.tolist() for s in state["cuda"]]
    return plain


def _live_rng(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """``_plain_rng`` undone (a state saved as tensors, by earlier versions, passes through)."""
    if state is None:
        return None
    live = dict(state)
    as_bytes = lambda s: s if isinstance(s, torch.Tensor) else torch.tensor(s, dtype=torch.uint8)  # noqa: E731
    live["torch"] = as_bytes(state["torch"])
    if "cuda" in state:
        live["cuda"] = [as_bytes(s) for s in state["cuda"]]
    return live


def own_record(ckpt: dict[str, Any]) -> Any:
    """gpulayer's own entry of a checkpoint: among the callbacks' (top level in files written before 2026-12)."""
    callbacks = ckpt.get("callbacks")
    own = callbacks.get(GPULAYER_KEY) if isinstance(callbacks, dict) else None
    return own if own is not None else ckpt.get(GPULAYER_KEY)


def fit_id_of(ckpt: Any) -> str | None:
    if not isinstance(ckpt, dict):
        return None
    own = own_record(ckpt)
    return own.get("fit_id") if isinstance(own, dict) else ckpt.get("gpulayer_fit_id")


def newest_of_fit(dirs: list[str], fit_id: str) -> tuple[str, dict[str, Any]] | None:
    """The newest full checkpoint (not weights only) in ``dirs`` that fit ``fit_id`` wrote, loaded; None if none.

    Files of other runs in the same directory (an earlier ``last.ckpt``) are passed over, newest first.
    """
    def mtime(path: str) -> float:
        try:
            return os.path.getmtime(path)
        except OSError:
            return -1.0

    files = {os.path.join(d, f) for d in dirs if os.path.isdir(d) for f in os.listdir(d) if f.endswith(".ckpt")}
    for path in sorted(files, key=mtime, reverse=True):
        try:
            ckpt = load(path) if not os.path.isdir(path) else sharded_record(path)
        except Exception:  # not a checkpoint torch can read (another tool's file): not ours either
            continue
        if fit_id_of(ckpt) == fit_id and "optimizer_states" in ckpt:
            return path, ckpt
    return None


# A sharded checkpoint is a directory (strategies/fsdp_checkpoint.py writes and reads its shards): the rest of
# the checkpoint is in META_FILE, which counts the optimizers whose states are shards beside it.
META_FILE = "meta.pt"
SHARDED_OPTIMIZER_COUNT = "gpulayer_sharded_optimizers"


@dataclass(frozen=True)
class ShardedOptimizerState:
    """Stands for optimizer ``index``'s state in a sharded checkpoint until the optimizer exists to read it."""

    path: str
    index: int


def sharded_record(path: str) -> dict[str, Any]:
    """What a sharded checkpoint directory holds besides its shards: its ``meta.pt``, the optimizer states as
    placeholders until the strategy reads them."""
    ckpt = torch.load(os.path.join(path, META_FILE), map_location="cpu", weights_only=False)
    count = ckpt.pop(SHARDED_OPTIMIZER_COUNT, 0)
    if count:
        ckpt["optimizer_states"] = [ShardedOptimizerState(path, i) for i in range(count)]
    return ckpt


def _position(trainer, ckpt: dict[str, Any]) -> dict[str, Any]:
    """Where to resume: gpulayer's own record when present, else derived from Lightning's loop counters."""
    own = own_record(ckpt)
    if isinstance(own, dict) and "epoch" in own:
        return {"epoch": own["epoch"], "batches_done": own["batches_done"], "epoch_done": own["epoch_done"],
                "batches_stepped": own.get("batches_stepped", ckpt["global_step"]),
                "rng": _live_rng(own.get("rng")), "epoch_rng": _live_rng(own.get("epoch_rng")),
                "acc": own.get("train_metric_acc", {})}
    if "gpulayer_checkpoint" in ckpt:  # gpulayer's first format (before it followed Lightning's keys)
        loops = ckpt.get("loops", {})
        return {"epoch": loops.get("epoch", ckpt.get("epoch", 0)), "batches_done": loops.get("batches_done", 0),
                "epoch_done": loops.get("epoch_done", True),
                "batches_stepped": loops.get("batches_stepped", ckpt["global_step"]),
                "rng": ckpt.get("rng"), "epoch_rng": ckpt.get("epoch_rng"), "acc": ckpt.get("train_metric_acc", {})}
    per_epoch = trainer.num_training_batches or float("inf")
    pos = checkpoint_loops.from_lightning(ckpt.get("loops") or {}, per_epoch) if ckpt.get("loops") else {
        "epoch": max(ckpt.get("epoch", 0) - 1, 0), "batches_done": 0, "epoch_done": ckpt.get("epoch", 0) > 0,
        "batches_stepped": ckpt.get("global_step", 0)}
    return {**pos, "rng": None, "epoch_rng": None, "acc": {}}


def restore_modules_and_callbacks(trainer, ckpt: dict[str, Any]) -> None:
    """A resume's first phase, before ``configure_optimizers`` (Lightning's order): the module's
    ``on_load_checkpoint`` (it may still edit the checkpoint), its weights, the datamodule's state, then every
    callback's ``on_load_checkpoint`` and ``load_state_dict``."""
    module = trainer.lightning_module
    if "optimizer_states" not in ckpt:
        raise TrainerError("the checkpoint holds weights only (save_weights_only=True); load it with "
                           "Model.load_from_checkpoint(path) or model.load_state_dict(torch.load(path)['state_dict']) "
                           "instead of fit(ckpt_path=...)")
    if callable(getattr(module, "on_load_checkpoint", None)):
        module.on_load_checkpoint(ckpt)
    module.load_state_dict(ckpt["state_dict"], strict=module.strict_loading)
    datamodule = trainer.datamodule
    if datamodule is not None and type(datamodule).__qualname__ in ckpt:
        with profile_hook(trainer, datamodule, "load_state_dict"):
            datamodule.load_state_dict(ckpt[type(datamodule).__qualname__])
    for cb in trainer.callbacks:
        cb.on_load_checkpoint(trainer, module, ckpt)
    saved_callbacks = ckpt.get("callbacks", {})
    missing = saved_callbacks.keys() - {cb.state_key for cb in trainer.callbacks} \
        - {getattr(cb, "_legacy_state_key", type(cb)) for cb in trainer.callbacks} - {GPULAYER_KEY}
    if missing:
        warnings.warn("Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided "
                      f"during `Trainer` instantiation. Please add the following callbacks: {list(missing)}.",
                      stacklevel=2)
    for cb in trainer.callbacks:
        state = saved_callbacks.get(cb.state_key)
        if state is None:
            state = saved_callbacks.get(getattr(cb, "_legacy_state_key", type(cb)))
        if state:
            cb.load_state_dict(state)


def restore_training_state(trainer, ckpt: dict[str, Any]) -> dict[str, Any]:
    """A resume's second phase, after ``on_fit_start``: optimizers, schedulers, the loss scaler, the counters;
    returns the loop position."""
    states = ckpt["optimizer_states"]
    if trainer.strategy.lightning_restore_optimizer:  # False: a strategy that restored them itself
        if len(states) != len(trainer.optimizers):
            raise TrainerError(f"the checkpoint has {len(states)} optimizer state(s) but configure_optimizers "
                               f"returned {len(trainer.optimizers)}")
        trainer.strategy.load_optimizer_state_dict(ckpt)  # each through load_optimizer_state (FSDP: into shards)
    for cfg, state in zip(trainer.lr_scheduler_configs, ckpt.get("lr_schedulers", [])):
        cfg.scheduler.load_state_dict(state)
    plugin = trainer.precision_plugin
    plugin_state = ckpt.get(type(plugin).__qualname__)
    if plugin_state is None and isinstance(plugin, MixedPrecision):  # an older file's key for the loss scaler
        plugin_state = ckpt.get(SCALER_KEY) or ckpt.get(_LEGACY_SCALER_KEY)
    if plugin_state:
        plugin.load_state_dict(plugin_state)
    pos = _position(trainer, ckpt)
    trainer.metric_store.import_acc("train", pos["acc"])
    trainer.global_step = ckpt["global_step"]
    trainer.batches_stepped = pos["batches_stepped"]
    # a validation had run before the save: the resumed fit's loop counters go on from there, as Lightning's do
    val = ((ckpt.get("loops") or {}).get("fit_loop") or {}).get("epoch_loop.val_loop.batch_progress") or {}
    trainer.val_has_run = bool((val.get("current") or {}).get("completed"))
    fit_state = ((ckpt.get("loops") or {}).get("fit_loop") or {}).get("state_dict") or {}
    return {"epoch": pos["epoch"], "batches_done": pos["batches_done"], "epoch_done": pos["epoch_done"],
            "rng": pos["rng"], "epoch_rng": pos["epoch_rng"], "loader_states": fit_state.get(loader_state.KEY, [])}


def hpc_resume_path(root_dir: str) -> str | None:
    """Lightning's ``ckpt_path="hpc"``: the highest-numbered ``hpc_ckpt_N.ckpt`` in the Trainer's root dir."""
    if not os.path.isdir(root_dir):
        return None
    numbers = [int(f[len("hpc_ckpt_"):-len(".ckpt")]) for f in os.listdir(root_dir)
               if f.startswith("hpc_ckpt_") and f.endswith(".ckpt") and f[len("hpc_ckpt_"):-len(".ckpt")].isdigit()]
    return os.path.join(root_dir, f"hpc_ckpt_{max(numbers)}.ckpt") if numbers else None
