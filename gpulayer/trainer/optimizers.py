"""What ``configure_optimizers`` may return (Lightning's forms), turned into optimizers and scheduler configs.

Accepted: an optimizer; a list of optimizers; ``([optimizers], [schedulers])``;
a dict ``{"optimizer": opt, "lr_scheduler": sched_or_dict, "monitor": name}``;
a list of such dicts. A scheduler dict holds ``scheduler``, ``interval``
(``"step"`` | ``"epoch"``), ``frequency``, ``monitor``, ``name``, ``strict``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gpulayer.trainer.errors import TrainerConfigError

_SCHED_KEYS = {"scheduler", "interval", "frequency", "monitor", "name", "strict", "reduce_on_plateau", "opt_idx"}


@dataclass
class SchedulerConfig:
    scheduler: Any
    optimizer: torch.optim.Optimizer
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None
    name: str | None = None
    strict: bool = True
    reduce_on_plateau: bool = False


def _is_optimizer(obj: Any) -> bool:
    return isinstance(obj, torch.optim.Optimizer)


def _scheduler_config(obj: Any, optimizer: torch.optim.Optimizer | None, monitor: str | None) -> SchedulerConfig:
    if isinstance(obj, dict):
        unknown = set(obj) - _SCHED_KEYS
        if "scheduler" not in obj or unknown:
            raise TrainerConfigError(
                f"configure_optimizers: a scheduler dict needs 'scheduler' and only the keys {sorted(_SCHED_KEYS)}; "
                f"got {sorted(obj)}"
            )
        cfg = dict(obj)
    else:
        cfg = {"scheduler": obj}
    sched = cfg["scheduler"]
    interval = cfg.get("interval", "epoch")
    if interval not in ("step", "epoch"):
        raise TrainerConfigError(f"configure_optimizers: lr_scheduler interval={interval!r}; accepted values: 'step', 'epoch'")
    frequency = cfg.get("frequency", 1)
    if not isinstance(frequency, int) or frequency < 1:
        raise TrainerConfigError(f"configure_optimizers: lr_scheduler frequency={frequency!r} must be an int >= 1")
    plateau = isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau) or bool(cfg.get("reduce_on_plateau"))
    monitor = cfg.get("monitor", monitor)
    if plateau and monitor is None:
        raise TrainerConfigError(
            "configure_optimizers: ReduceLROnPlateau needs a metric; return "
            "{'optimizer': opt, 'lr_scheduler': {'scheduler': sched, 'monitor': 'val_loss'}}"
        )
    opt = getattr(sched, "optimizer", optimizer)
    return SchedulerConfig(sched, opt, interval, frequency, monitor, cfg.get("name"), cfg.get("strict", True), plateau)


def parse(result: Any) -> tuple[list[torch.optim.Optimizer], list[SchedulerConfig]]:
    """(optimizers, scheduler configs) from ``configure_optimizers()``'s return value."""
    if result is None:
        raise TrainerConfigError("configure_optimizers() returned None; return an optimizer, e.g. torch.optim.SGD(self.parameters(), lr=0.1)")
    if _is_optimizer(result):
        return [result], []
    if isinstance(result, dict):
        return _from_dicts([result])
    if isinstance(result, (list, tuple)):
        items = list(result)
        if len(items) == 2 and isinstance(items[0], (list, tuple)) and isinstance(items[1], (list, tuple)):
            opts = list(items[0])
            if not all(_is_optimizer(o) for o in opts):
                raise TrainerConfigError("configure_optimizers: the first list of ([optimizers], [schedulers]) must hold optimizers")
            return opts, [_scheduler_config(s, opts[0] if len(opts) == 1 else None, None) for s in items[1]]
        if items and all(isinstance(i, dict) for i in items):
            return _from_dicts(items)
        if items and all(_is_optimizer(i) for i in items):
            return items, []
    raise TrainerConfigError(
        f"configure_optimizers() returned {type(result).__name__}, which is not one of Lightning's forms: an optimizer, "
        "a list of optimizers, ([optimizers], [schedulers]), or {'optimizer': opt, 'lr_scheduler': sched}"
    )


def _from_dicts(dicts: list[dict]) -> tuple[list[torch.optim.Optimizer], list[SchedulerConfig]]:
    opts, scheds = [], []
    for d in dicts:
        unknown = set(d) - {"optimizer", "lr_scheduler", "monitor"}
        if "optimizer" not in d or unknown or not _is_optimizer(d["optimizer"]):
            raise TrainerConfigError(
                "configure_optimizers: a dict must be {'optimizer': opt, 'lr_scheduler': ..., 'monitor': ...}; "
                f"got keys {sorted(d)}"
            )
        opts.append(d["optimizer"])
        if d.get("lr_scheduler") is not None:
            scheds.append(_scheduler_config(d["lr_scheduler"], d["optimizer"], d.get("monitor")))
    return opts, scheds
