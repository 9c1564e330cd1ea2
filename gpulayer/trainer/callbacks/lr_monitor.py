"""``LearningRateMonitor``: log the optimizers' learning rates (Lightning's ``callbacks.lr_monitor``).

Names follow Lightning: ``lr-<OptimizerClass>`` (``-1``, ``-2`` for further optimizers of the same class),
a scheduler's ``name`` when it has one, ``/pg1``, ``/pg2`` (or the group's ``name``) for several parameter
groups; ``-momentum`` and ``-weight_decay`` after the name. The values go to the loggers and into
``trainer.callback_metrics``, so ``EarlyStopping`` / ``ModelCheckpoint`` can monitor ``lr-SGD``.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.errors import MisconfigurationException


class LearningRateMonitor(Callback):
    """Log each optimizer's learning rates at every logged step, at every epoch, or at the schedulers' intervals.

    ``logging_interval``: ``"step"``, ``"epoch"`` or ``None`` (each scheduler's own interval; optimizers
    without a scheduler at both). ``lrs`` keeps every value logged per name; ``last_momentum_values`` and
    ``last_weight_decay_values`` the latest ones.
    """

    def __init__(self, logging_interval: str | None = None, log_momentum: bool = False, log_weight_decay: bool = False):
        if logging_interval not in (None, "step", "epoch"):
            raise MisconfigurationException("logging_interval should be `step` or `epoch` or `None`.")
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self.lrs: dict[str, list[float]] = {}
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        if not trainer.loggers:
            raise MisconfigurationException(
                "Cannot use `LearningRateMonitor` callback with `Trainer` that has no logger.")
        if self.log_momentum:
            watched = [c.optimizer for c in trainer.lr_scheduler_configs] or list(trainer.optimizers)
            if any("momentum" not in o.defaults for o in watched) and any("betas" not in o.defaults for o in watched):
                warnings.warn("You have set log_momentum=True, but some optimizers do not have momentum. This will log a"
                              " value 0 for the momentum.", RuntimeWarning, stacklevel=2)
        names = [n for group in self._names(trainer)[0] for n in group]
        self.lrs = {n: [] for n in names}
        self.last_momentum_values = {f"{n}-momentum": None for n in names}
        self.last_weight_decay_values = {f"{n}-weight_decay": None for n in names}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # at the batch start, on the steps whose metrics the trainer logs
        every = trainer.log_every_n_steps
        if self.logging_interval == "epoch" or not every:
            return
        if (trainer.batches_stepped + 1) % every and not trainer.should_stop:
            return
        self._log(trainer, "step" if self.logging_interval is None else "any")

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.logging_interval != "step":
            self._log(trainer, "epoch" if self.logging_interval is None else "any")

    # -- values ------------------------------------------------------------------------------
    def _log(self, trainer, interval: str) -> None:
        stats: dict[str, float] = {}
        groups, owners, intervals = self._names(trainer)
        for names in groups:  # a parameter group added since (fine-tuning): "lr-SGD" becomes "lr-SGD/pg1"
            for name in names:
                single = name.replace("/pg1", "")
                if "/pg1" in name and single in self.lrs:
                    self.lrs[name] = self.lrs.pop(single)
                self.lrs.setdefault(name, [])
        for names, opt, when in zip(groups, owners, intervals):
            if when is not None and interval not in (when, "any"):
                continue
            use_betas = "betas" in opt.defaults
            for group, name in zip(opt.param_groups, names):
                stats[name] = group["lr"]
                self.lrs[name].append(group["lr"])
                if self.log_momentum:
                    m = group["betas"][0] if use_betas else group.get("momentum", 0)
                    stats[f"{name}-momentum"] = self.last_momentum_values[f"{name}-momentum"] = m
                if self.log_weight_decay:
                    wd = group["weight_decay"]
                    stats[f"{name}-weight_decay"] = self.last_weight_decay_values[f"{name}-weight_decay"] = wd
        if not stats:
            return
        device = trainer.strategy.root_device if trainer.strategy is not None else None
        trainer.callback_metrics.update({k: torch.tensor(v, device=device) for k, v in stats.items()})
        trainer.log_to_logger(stats, step=trainer.batches_stepped)

    def _names(self, trainer) -> tuple[list[list[str]], list[Any], list[str | None]]:
        """Per watched optimizer: its names (one per parameter group), the optimizer, its scheduler's interval.

        Scheduled optimizers come first, in scheduler order; optimizers without a scheduler follow (logged at
        any interval).
        """
        groups, owners, intervals = [], [], []
        per_class: dict[type, int] = {}

        def add(opt: Any, name: str, counted: bool, interval: str | None) -> None:
            if counted:
                per_class[type(opt)] = per_class.get(type(opt), 0) + 1
            pgs = opt.param_groups
            labels = [pg.get("name", f"pg{i}") for i, pg in enumerate(pgs, start=1)]
            dupes = {n for n in labels if labels.count(n) > 1}
            if dupes:
                raise MisconfigurationException(
                    "A single `Optimizer` cannot have multiple parameter groups with identical `name` values. "
                    f"{name} has duplicated parameter group names {dupes}")
            seen = per_class.get(type(opt), 0)
            if seen > 1:
                name = f"{name}-{seen - 1}"
            if len(pgs) > 1:
                names = [f"{name}/{pg.get('name', f'pg{i}')}" for i, pg in enumerate(pgs, start=1)]
            else:
                names = [f"{name}/{pgs[0]['name']}" if pgs[0].get("name") else name]
            groups.append(names)
            owners.append(opt)
            intervals.append(interval)

        scheduled = []
        for cfg in trainer.lr_scheduler_configs:
            opt = cfg.scheduler.optimizer
            scheduled.append(opt)
            add(opt, cfg.name if cfg.name is not None else f"lr-{type(opt).__name__}", cfg.name is None, cfg.interval)
        for opt in trainer.optimizers:
            opt = getattr(opt, "optimizer", opt)
            if any(opt is s for s in scheduled):
                continue
            scheduled.append(opt)
            add(opt, f"lr-{type(opt).__name__}", True, None)
        return groups, owners, intervals
