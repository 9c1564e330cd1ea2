"""``EarlyStopping``: stop when a monitored metric stops improving (Lightning's ``callbacks.early_stopping``).

Scores are kept as tensors and the state (``wait_count``, ``stopped_epoch``,
``best_score``, ``patience``, the stopping reason) has Lightning's keys, under
Lightning's ``state_key``, so a checkpoint's early-stopping state moves between
the two. The check runs at train epoch end when validation runs once at every
epoch end (or never), else at validation end, as Lightning decides it.
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import Any

import torch

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.errors import TrainerConfigError
from gpulayer.trainer.utilities.rank_zero import rank_zero_warn

log = logging.getLogger(__name__)


class EarlyStoppingReason(Enum):
    """Why ``EarlyStopping`` stopped the fit (``stopping_reason``)."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved by more than ``min_delta`` for ``patience`` checks in a row.

    ``stopping_threshold`` stops once the metric is better than it; ``divergence_threshold``
    once it is worse; ``check_finite`` on NaN or infinity.
    """

    mode_dict = {"min": torch.lt, "max": torch.gt}
    order_dict = {"min": "<", "max": ">"}

    def __init__(self, monitor: str, min_delta: float = 0.0, patience: int = 3, verbose: bool = False, mode: str = "min",
                 strict: bool = True, check_finite: bool = True, stopping_threshold: float | None = None,
                 divergence_threshold: float | None = None, check_on_train_epoch_end: bool | None = None,
                 log_rank_zero_only: bool = False):
        super().__init__()
        self.monitor = monitor
        self.min_delta = min_delta
        self.patience = patience
        self.verbose = verbose
        self.mode = mode
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.wait_count = 0
        self.stopped_epoch = 0
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None
        self._check_on_train_epoch_end = check_on_train_epoch_end
        self.log_rank_zero_only = log_rank_zero_only
        if self.mode not in self.mode_dict:
            raise TrainerConfigError(f"`mode` can be {', '.join(self.mode_dict.keys())}, got {self.mode} "
                                     f"(EarlyStopping(mode={self.mode!r}): use 'min' or 'max')")
        # stored signed: improving means monitor_op(current - min_delta, best)
        self.min_delta *= 1 if self.monitor_op == torch.gt else -1
        inf = torch.tensor(torch.inf)
        self.best_score = inf if self.monitor_op == torch.lt else -inf

    @property
    def monitor_op(self) -> Any:
        return self.mode_dict[self.mode]

    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, mode=self.mode)

    def state_dict(self) -> dict[str, Any]:
        return {"wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch, "best_score": self.best_score,
                "patience": self.patience, "stopping_reason": self.stopping_reason.value,
                "stopping_reason_message": self.stopping_reason_message}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.wait_count = state_dict["wait_count"]
        self.stopped_epoch = state_dict["stopped_epoch"]
        best = state_dict["best_score"]
        self.best_score = best if isinstance(best, torch.Tensor) else torch.tensor(float(best))
        self.patience = state_dict.get("patience", self.patience)
        self.stopping_reason = EarlyStoppingReason(state_dict.get("stopping_reason", 0))
        self.stopping_reason_message = state_dict.get("stopping_reason_message")

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self._check_on_train_epoch_end is None:
            # validation more than once an epoch, or not every epoch: decide after validation instead
            self._check_on_train_epoch_end = trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1

    def _should_skip_check(self, trainer) -> bool:
        state = getattr(trainer, "state", None)
        fn = getattr(state, "fn", None)
        fitting = (getattr(fn, "value", fn) == "fit") if fn is not None else getattr(trainer, "state_stage", "fit") == "fit"
        return not fitting or trainer.sanity_checking

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not self._check_on_train_epoch_end or self._should_skip_check(trainer):
            return
        self._run_early_stopping_check(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._check_on_train_epoch_end or self._should_skip_check(trainer):
            return
        self._run_early_stopping_check(trainer)

    def _validate_condition_metric(self, logs: dict[str, Any]) -> bool:
        if logs.get(self.monitor) is not None:
            return True
        error_msg = (f"Early stopping conditioned on metric `{self.monitor}` which is not available. Pass in or modify "
                     f"your `EarlyStopping` callback to use any of the following: `{'`, `'.join(list(logs.keys()))}`")
        if self.strict:
            raise RuntimeError(error_msg)
        if self.verbose > 0:
            rank_zero_warn(error_msg, category=RuntimeWarning)
        return False

    def _run_early_stopping_check(self, trainer) -> None:
        logs = trainer.callback_metrics
        if trainer.fast_dev_run or not self._validate_condition_metric(logs):
            return
        current = logs[self.monitor]
        current = (current if isinstance(current, torch.Tensor) else torch.tensor(float(current))).squeeze()
        should_stop, reason = self._evaluate_stopping_criteria(current)
        if trainer.world_size > 1 and hasattr(trainer.strategy, "any"):
            should_stop = bool(trainer.strategy.any(should_stop))  # one rank stopping stops all, as Lightning
        trainer.should_stop = trainer.should_stop or should_stop
        if should_stop:
            self.stopped_epoch = trainer.current_epoch
        if reason and self.verbose:
            self._log_info(trainer, reason, self.log_rank_zero_only)

    def _evaluate_stopping_criteria(self, current: torch.Tensor) -> tuple[bool, str | None]:
        should_stop, reason = False, None
        order = self.order_dict[self.mode]
        if self.check_finite and not torch.isfinite(current):
            should_stop = True
            reason = (f"Monitored metric {self.monitor} = {current} is not finite. Previous best value was "
                      f"{self.best_score:.3f}. Signaling Trainer to stop.")
            self.stopping_reason = EarlyStoppingReason.NON_FINITE_METRIC
        elif self.stopping_threshold is not None and self.monitor_op(current, self.stopping_threshold):
            should_stop = True
            reason = (f"Stopping threshold reached: {self.monitor} = {current} {order} {self.stopping_threshold}. "
                      "Signaling Trainer to stop.")
            self.stopping_reason = EarlyStoppingReason.STOPPING_THRESHOLD
        elif self.divergence_threshold is not None and self.monitor_op(-current, -self.divergence_threshold):
            should_stop = True
            reason = (f"Divergence threshold reached: {self.monitor} = {current} {order} {self.divergence_threshold}. "
                      "Signaling Trainer to stop.")
            self.stopping_reason = EarlyStoppingReason.DIVERGENCE_THRESHOLD
        elif self.monitor_op(current - self.min_delta, self.best_score.to(current.device)):
            reason = self._improvement_message(current)
            self.best_score = current
            self.wait_count = 0
        else:
            self.wait_count += 1
            if self.wait_count >= self.patience:
                should_stop = True
                reason = (f"Monitored metric {self.monitor} did not improve in the last {self.wait_count} records. "
                          f"Best score: {self.best_score:.3f}. Signaling Trainer to stop.")
                self.stopping_reason = EarlyStoppingReason.PATIENCE_EXHAUSTED
        if should_stop:
            self.stopping_reason_message = reason
        return should_stop, reason

    def _improvement_message(self, current: torch.Tensor) -> str:
        if torch.isfinite(self.best_score):
            return (f"Metric {self.monitor} improved by {abs(self.best_score - current):.3f} >= "
                    f"min_delta = {abs(self.min_delta)}. New best score: {current:.3f}")
        return f"Metric {self.monitor} improved. New best score: {current:.3f}"

    @staticmethod
    def _log_info(trainer, message: str, log_rank_zero_only: bool) -> None:
        rank = trainer.global_rank if trainer.world_size > 1 else None
        if rank is not None:
            message = f"[rank: {rank}] {message}"
        if rank is None or not log_rank_zero_only or rank == 0:
            log.info(message)
