"""What surrounds every stage a Trainer runs (fit, validate, test, predict) when asked for.

``Trainer(profiler=...)``: the profiler is set up before the stage and writes its summary
after it (``profilers.py``). ``Trainer(detect_anomaly=True)``: autograd's anomaly detection
is on for the stage, so a backward that produces NaN names the forward operation behind it.
Neither costs anything when off.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from gpulayer.trainer import profilers


@contextlib.contextmanager
def around_stage(trainer: Any, stage: str) -> Iterator[None]:
    cfg = trainer.config
    profiler = cfg.profiler
    profiling = profilers.active(profiler)
    if profiling:
        log_dir = trainer.log_dir if trainer.logger is not None else trainer.default_root_dir
        profiler._lightning_module = trainer.lightning_module  # as Lightning's: PyTorchProfiler names its modules
        profiler.setup(stage=stage, local_rank=trainer.local_rank if trainer.world_size > 1 else None, log_dir=log_dir)
    try:
        with torch.autograd.set_detect_anomaly(True) if cfg.detect_anomaly else contextlib.nullcontext():
            yield
    finally:
        if profiling:
            profiler.describe()


def hook_action(owner: Any, hook: str) -> str:
    """Lightning's action name of a datamodule's or a module's hook: ``[LightningDataModule]DM.setup``."""
    from gpulayer.trainer.datamodule import LightningDataModule
    kind = "LightningDataModule" if isinstance(owner, LightningDataModule) else "LightningModule"
    return f"[{kind}]{type(owner).__name__}.{hook}"


def profile_hook(trainer: Any, owner: Any, hook: str) -> contextlib.AbstractContextManager:
    """``with profile_hook(trainer, dm, "setup"): dm.setup(...)``: recorded as Lightning names it."""
    profiler = getattr(trainer, "profiler", None)
    if not profilers.active(profiler):
        return contextlib.nullcontext()
    return profiler.profile(hook_action(owner, hook))
