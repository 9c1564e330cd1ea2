"""Checkpoint contents: everything a resumed fit needs to continue exactly where it stopped.

Besides Lightning's keys (``state_dict``, ``optimizer_states``, ``lr_schedulers``,
``epoch``, ``global_step``, ``callbacks``) a gpulayer checkpoint records the loop
position inside the epoch and two sets of RNG states: the ones at the start of
the epoch (to rebuild the same shuffled order) and the ones at the save (to
continue dropout and friends with the same numbers).
"""

from __future__ import annotations

import io
import os
from typing import Any

import torch

from gpulayer.trainer.errors import TrainerError
from gpulayer.trainer.seed import capture_rng

FORMAT_VERSION = 1
FIT_ID = "gpulayer_fit_id"  # which cluster fit wrote the file: a restart resumes only from its own


def dump(trainer, weights_only: bool = False) -> dict[str, Any]:
    module = trainer.lightning_module
    loop = trainer._loop
    ckpt: dict[str, Any] = {
        "gpulayer_checkpoint": FORMAT_VERSION,
        "epoch": trainer.current_epoch,
        "global_step": trainer.global_step,
        "state_dict": module.state_dict(),
        "hyper_parameters": dict(module.hparams),
        "loops": {
            "epoch": trainer.current_epoch,
            "batches_done": loop.batches_done if loop is not None else 0,
            "epoch_done": loop.epoch_done if loop is not None else True,
            "batches_stepped": trainer._batches_stepped,
        },
    }
    if trainer._fit_id is not None:
        ckpt[FIT_ID] = trainer._fit_id
    if not weights_only:
        ckpt["optimizer_states"] = [o.state_dict() for o in trainer.optimizers]
        ckpt["lr_schedulers"] = [c.scheduler.state_dict() for c in trainer.lr_scheduler_configs]
        ckpt["precision"] = trainer._precision.state_dict() if trainer._precision is not None else {}
        ckpt["callbacks"] = {cb.state_key: cb.state_dict() for cb in trainer.callbacks}
        ckpt["rng"] = capture_rng()
        ckpt["epoch_rng"] = loop.epoch_start_rng if loop is not None else None
        ckpt["train_metric_acc"] = trainer._store.export_acc("train")
    trainer._hooks.call("on_save_checkpoint", ckpt)
    return ckpt


def save(ckpt: dict[str, Any], path: str) -> None:
    """Write atomically: a crash mid-write never leaves a truncated checkpoint under ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    buf = io.BytesIO()  # serialise first, as Lightning's checkpoint IO does, then write the bytes in one go
    torch.save(ckpt, buf)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(buf.getbuffer())
    os.replace(tmp, path)


def load(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise TrainerError(f"fit(ckpt_path={path!r}): no such checkpoint file")
    return torch.load(path, map_location="cpu", weights_only=False)


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
            ckpt = load(path)
        except Exception:  # not a checkpoint torch can read (another tool's file): not ours either
            continue
        if isinstance(ckpt, dict) and ckpt.get(FIT_ID) == fit_id and "optimizer_states" in ckpt:
            return path, ckpt
    return None


def restore(trainer, ckpt: dict[str, Any]) -> dict[str, Any]:
    """Load weights, optimizers, schedulers, scaler, callbacks and counters; return the loop position."""
    module = trainer.lightning_module
    module.load_state_dict(ckpt["state_dict"])
    if ckpt.get("hyper_parameters"):
        module._hparams.update(ckpt["hyper_parameters"])
    trainer._hooks.call("on_load_checkpoint", ckpt)
    if "optimizer_states" not in ckpt:
        raise TrainerError("the checkpoint holds weights only (save_weights_only=True); load it with "
                           "model.load_state_dict(torch.load(path)['state_dict']) instead of fit(ckpt_path=...)")
    states = ckpt["optimizer_states"]
    if len(states) != len(trainer.optimizers):
        raise TrainerError(f"the checkpoint has {len(states)} optimizer state(s) but configure_optimizers returned "
                           f"{len(trainer.optimizers)}")
    for opt, state in zip(trainer.optimizers, states):
        opt.load_state_dict(state)
    for cfg, state in zip(trainer.lr_scheduler_configs, ckpt.get("lr_schedulers", [])):
        cfg.scheduler.load_state_dict(state)
    trainer._precision.load_state_dict(ckpt.get("precision", {}))
    saved_callbacks = ckpt.get("callbacks", {})
    for cb in trainer.callbacks:
        if cb.state_key in saved_callbacks:
            cb.load_state_dict(saved_callbacks[cb.state_key])
    trainer._store.import_acc("train", ckpt.get("train_metric_acc", {}))
    trainer.global_step = ckpt["global_step"]
    trainer._batches_stepped = ckpt.get("loops", {}).get("batches_stepped", ckpt["global_step"])
    loops = ckpt.get("loops", {"epoch": ckpt.get("epoch", 0), "batches_done": 0, "epoch_done": True})
    return {"epoch": loops["epoch"], "batches_done": loops["batches_done"], "epoch_done": loops["epoch_done"],
            "rng": ckpt.get("rng"), "epoch_rng": ckpt.get("epoch_rng")}
