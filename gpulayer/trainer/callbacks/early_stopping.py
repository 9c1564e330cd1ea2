"""``EarlyStopping``: stop when a monitored metric stops improving (Lightning's ``callbacks.early_stopping``)."""

from __future__ import annotations

import math
from typing import Any

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.errors import TrainerConfigError, TrainerError


def _check_mode(owner: str, mode: str) -> None:
    if mode not in ("min", "max"):
        raise TrainerConfigError(f"{owner}(mode={mode!r}) is not supported; accepted values: 'min', 'max'")


class MonitorNotLogged(TrainerError, RuntimeError):
    """The monitored metric was never logged (a ``RuntimeError`` in Lightning's documentation, so both catch it)."""


def _monitored(trainer, owner: str, monitor: str) -> float:
    metrics = trainer.callback_metrics
    if monitor not in metrics:
        raise MonitorNotLogged(
            f"{owner}(monitor={monitor!r}) could not find {monitor!r} in the logged metrics "
            f"(available: {sorted(metrics)}); log it with self.log({monitor!r}, value) in the module"
        )
    return float(metrics[monitor])


def _runs_at_train_epoch_end(trainer) -> bool:
    # Lightning's rule: with validation once at every epoch end, decide after it, at train epoch end
    return trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1 or not trainer.has_val_loader


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved by ``min_delta`` for ``patience`` checks."""

    def __init__(self, monitor: str, min_delta: float = 0.0, patience: int = 3, verbose: bool = False, mode: str = "min",
                 strict: bool = True, check_finite: bool = True, stopping_threshold: float | None = None,
                 divergence_threshold: float | None = None, check_on_train_epoch_end: bool | None = None):
        _check_mode("EarlyStopping", mode)
        if not isinstance(patience, int) or patience < 0:
            raise TrainerConfigError(f"EarlyStopping(patience={patience!r}) must be an int >= 0")
        self.monitor, self.min_delta, self.patience, self.verbose = monitor, abs(float(min_delta)), patience, verbose
        self.mode, self.strict, self.check_finite = mode, strict, check_finite
        self.stopping_threshold, self.divergence_threshold = stopping_threshold, divergence_threshold
        self.check_on_train_epoch_end = check_on_train_epoch_end
        self.wait_count = 0
        self.stopped_epoch = 0
        self.best_score = math.inf if mode == "min" else -math.inf

    @property
    def state_key(self) -> str:
        return f"EarlyStopping{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}}}"

    def state_dict(self) -> dict[str, Any]:
        return {"wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch, "best_score": self.best_score,
                "patience": self.patience}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.wait_count = state_dict["wait_count"]
        self.stopped_epoch = state_dict["stopped_epoch"]
        self.best_score = float(state_dict["best_score"])

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._at_train_epoch_end(trainer):
            self._check(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and not self._at_train_epoch_end(trainer):
            self._check(trainer)

    def _at_train_epoch_end(self, trainer) -> bool:
        return self.check_on_train_epoch_end if self.check_on_train_epoch_end is not None else _runs_at_train_epoch_end(trainer)

    def _check(self, trainer) -> None:
        if self.monitor not in trainer.callback_metrics and not self.strict:
            return
        current = _monitored(trainer, "EarlyStopping", self.monitor)
        improved = current < self.best_score - self.min_delta if self.mode == "min" else current > self.best_score + self.min_delta
        stop, reason = False, ""
        if self.check_finite and not math.isfinite(current):
            stop, reason = True, f"{self.monitor} = {current} is not finite"
        elif self.stopping_threshold is not None and (
                current < self.stopping_threshold if self.mode == "min" else current > self.stopping_threshold):
            stop, reason = True, f"{self.monitor} reached the stopping threshold {self.stopping_threshold}"
        elif self.divergence_threshold is not None and (
                current > self.divergence_threshold if self.mode == "min" else current < self.divergence_threshold):
            stop, reason = True, f"{self.monitor} diverged past {self.divergence_threshold}"
        elif improved:
            self.best_score, self.wait_count = current, 0
        else:
            self.wait_count += 1
            if self.wait_count >= self.patience:
                stop, reason = True, f"{self.monitor} did not improve in the last {self.wait_count} checks (best {self.best_score:.6g})"
        if stop:
            self.stopped_epoch = trainer.current_epoch
            trainer.should_stop = True
            if self.verbose and trainer.is_global_zero:
                print(f"EarlyStopping: {reason}; stopping.")
