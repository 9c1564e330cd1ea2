"""``LearningRateMonitor``: log the optimizers' learning rates (Lightning's ``callbacks.lr_monitor``)."""

from __future__ import annotations

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.errors import TrainerConfigError


class LearningRateMonitor(Callback):
    """Log each optimizer's learning rates (``lr-SGD``, ``lr-Adam/pg1``...) to the logger."""

    def __init__(self, logging_interval: str | None = None, log_momentum: bool = False, log_weight_decay: bool = False):
        if logging_interval not in (None, "step", "epoch"):
            raise TrainerConfigError(
                f"LearningRateMonitor(logging_interval={logging_interval!r}): accepted values: None, 'step', 'epoch'"
            )
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.logger is None:
            raise TrainerConfigError("LearningRateMonitor needs a logger; drop Trainer(logger=False) or the callback")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.logging_interval == "epoch" or not trainer.is_log_step:
            return
        self._log(trainer, interval="step")

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.logging_interval != "step":
            self._log(trainer, interval="epoch")

    def _log(self, trainer, interval: str) -> None:
        stats = {}
        scheduled = {id(c.optimizer): c.interval for c in trainer.lr_scheduler_configs}
        names: dict[str, int] = {}
        for opt in trainer.optimizers:
            if self.logging_interval is None and scheduled.get(id(opt), "epoch") != interval:
                continue
            base = f"lr-{type(opt).__name__}"
            names[base] = names.get(base, 0) + 1
            name = base if names[base] == 1 else f"{base}-{names[base] - 1}"
            groups = opt.param_groups
            for i, group in enumerate(groups):
                key = name if len(groups) == 1 else f"{name}/pg{i + 1}"
                stats[key] = float(group["lr"])
                if self.log_momentum:
                    m = group.get("momentum", group.get("betas", (0.0,))[0] if "betas" in group else 0.0)
                    stats[f"{key}-momentum"] = float(m)
                if self.log_weight_decay:
                    stats[f"{key}-weight_decay"] = float(group.get("weight_decay", 0.0))
        if stats:
            trainer.log_to_logger(stats)
