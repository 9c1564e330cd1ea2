"""Callbacks with Lightning's names: ``Callback``, ``ModelCheckpoint``, ``EarlyStopping``, ``LearningRateMonitor``.

A callback overrides only the hooks it needs; the Trainer never calls the others.
Callbacks run on every rank; files are written by global rank 0 only.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import torch

from gpulayer.trainer.errors import TrainerConfigError, TrainerError


class Callback:
    """Base class; hooks receive ``(trainer, pl_module, ...)`` like Lightning's."""

    @property
    def state_key(self) -> str:
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    def setup(self, trainer, pl_module, stage: str) -> None: ...
    def teardown(self, trainer, pl_module, stage: str) -> None: ...
    def on_fit_start(self, trainer, pl_module) -> None: ...
    def on_fit_end(self, trainer, pl_module) -> None: ...
    def on_train_start(self, trainer, pl_module) -> None: ...
    def on_train_end(self, trainer, pl_module) -> None: ...
    def on_train_epoch_start(self, trainer, pl_module) -> None: ...
    def on_train_epoch_end(self, trainer, pl_module) -> None: ...
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None: ...
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None: ...
    def on_validation_start(self, trainer, pl_module) -> None: ...
    def on_validation_end(self, trainer, pl_module) -> None: ...
    def on_validation_epoch_start(self, trainer, pl_module) -> None: ...
    def on_validation_epoch_end(self, trainer, pl_module) -> None: ...
    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None: ...
    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None: ...
    def on_sanity_check_start(self, trainer, pl_module) -> None: ...
    def on_sanity_check_end(self, trainer, pl_module) -> None: ...
    def on_test_start(self, trainer, pl_module) -> None: ...
    def on_test_end(self, trainer, pl_module) -> None: ...
    def on_test_epoch_start(self, trainer, pl_module) -> None: ...
    def on_test_epoch_end(self, trainer, pl_module) -> None: ...
    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None: ...
    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None: ...
    def on_predict_start(self, trainer, pl_module) -> None: ...
    def on_predict_end(self, trainer, pl_module) -> None: ...
    def on_predict_epoch_start(self, trainer, pl_module) -> None: ...
    def on_predict_epoch_end(self, trainer, pl_module) -> None: ...
    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None: ...
    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None: ...
    def on_exception(self, trainer, pl_module, exception) -> None: ...
    def on_before_backward(self, trainer, pl_module, loss) -> None: ...
    def on_after_backward(self, trainer, pl_module) -> None: ...
    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None: ...
    def on_before_zero_grad(self, trainer, pl_module, optimizer) -> None: ...
    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None: ...
    def on_load_checkpoint(self, trainer, pl_module, checkpoint) -> None: ...


def _check_mode(owner: str, mode: str) -> None:
    if mode not in ("min", "max"):
        raise TrainerConfigError(f"{owner}(mode={mode!r}) is not supported; accepted values: 'min', 'max'")


def _monitored(trainer, owner: str, monitor: str) -> float:
    metrics = trainer.callback_metrics
    if monitor not in metrics:
        raise TrainerError(
            f"{owner}(monitor={monitor!r}) could not find {monitor!r} in the logged metrics "
            f"(available: {sorted(metrics)}); log it with self.log({monitor!r}, value) in the module"
        )
    return float(metrics[monitor])


def _runs_at_train_epoch_end(trainer) -> bool:
    # Lightning's rule: with validation once at every epoch end, decide after it, at train epoch end
    return trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1 or not trainer.has_val_loader


class ModelCheckpoint(Callback):
    """Save checkpoints: the top ``save_top_k`` by ``monitor``, or the latest, and ``last.ckpt``.

    Filenames follow Lightning: ``filename="{epoch}-{val_loss:.2f}"`` gives
    ``epoch=3-val_loss=0.12.ckpt``; the default is ``epoch={epoch}-step={step}``.
    """

    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str | os.PathLike | None = None, filename: str | None = None, monitor: str | None = None,
                 verbose: bool = False, save_last: bool | None = None, save_top_k: int = 1, save_weights_only: bool = False,
                 mode: str = "min", auto_insert_metric_name: bool = True, every_n_train_steps: int | None = None,
                 every_n_epochs: int | None = None, save_on_train_epoch_end: bool | None = None):
        _check_mode("ModelCheckpoint", mode)
        if not isinstance(save_top_k, int) or save_top_k < -1:
            raise TrainerConfigError(f"ModelCheckpoint(save_top_k={save_top_k!r}) must be -1 (all), 0 (none) or a positive int")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise TrainerConfigError(
                f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) has no quantity to rank checkpoints by; "
                "set monitor='val_loss' (or another logged metric) or save_top_k=1/-1"
            )
        for name, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise TrainerConfigError(f"ModelCheckpoint({name}={value!r}) must be None or an int >= 0")
        self.dirpath = os.fspath(dirpath) if dirpath is not None else None
        self.filename = filename
        self.monitor = monitor
        self.verbose = verbose
        self.save_last = save_last
        self.save_top_k = save_top_k
        self.save_weights_only = save_weights_only
        self.mode = mode
        self.auto_insert_metric_name = auto_insert_metric_name
        self.every_n_train_steps = every_n_train_steps or 0
        self.every_n_epochs = 1 if every_n_epochs is None else every_n_epochs
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.best_k_models: dict[str, float] = {}
        self.best_model_path = ""
        self.best_model_score: torch.Tensor | None = None
        self.last_model_path = ""
        self._last_global_step_saved = -1

    @property
    def state_key(self) -> str:
        return f"ModelCheckpoint{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}}}"

    def state_dict(self) -> dict[str, Any]:
        return {"dirpath": self.dirpath, "best_model_path": self.best_model_path, "best_model_score": self.best_model_score,
                "best_k_models": dict(self.best_k_models), "last_model_path": self.last_model_path}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath") == self.dirpath or self.dirpath is None:
            self.dirpath = state_dict.get("dirpath")
            self.best_model_path = state_dict.get("best_model_path", "")
            self.best_model_score = state_dict.get("best_model_score")
            self.best_k_models = dict(state_dict.get("best_k_models", {}))
            self.last_model_path = state_dict.get("last_model_path", "")

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.dirpath is None:
            base = trainer.logger.log_dir if trainer.logger is not None else trainer.default_root_dir
            self.dirpath = os.path.join(base, "checkpoints")

    # -- when to save -------------------------------------------------------------------
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        n = self.every_n_train_steps
        if n and trainer.global_step % n == 0 and trainer.global_step != self._last_global_step_saved:
            self._save(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._epoch_save_due(trainer) and self._at_train_epoch_end(trainer):
            self._save(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and self._epoch_save_due(trainer) and not self._at_train_epoch_end(trainer):
            self._save(trainer)

    def _at_train_epoch_end(self, trainer) -> bool:
        return self.save_on_train_epoch_end if self.save_on_train_epoch_end is not None else _runs_at_train_epoch_end(trainer)

    def _epoch_save_due(self, trainer) -> bool:
        if self.every_n_train_steps or not self.every_n_epochs:
            return False
        return (trainer.current_epoch + 1) % self.every_n_epochs == 0 and trainer.global_step != self._last_global_step_saved

    # -- saving ---------------------------------------------------------------------------
    def format_checkpoint_name(self, metrics: dict[str, Any], epoch: int, step: int) -> str:
        template = self.filename or "{epoch}-{step}"
        values = {k.replace("/", "_"): v for k, v in metrics.items()}
        values.update(epoch=epoch, step=step)
        for group in re.findall(r"(\{.*?)[:\}]", template):
            name = group[1:]
            if self.auto_insert_metric_name:
                template = template.replace(group, f"{name}={{{name}", 1)
            values.setdefault(name, 0)
        values = {k: (float(v) if isinstance(v, torch.Tensor) else v) for k, v in values.items()}
        return template.format(**values)

    def _path(self, name: str) -> str:
        return os.path.join(self.dirpath, name + self.FILE_EXTENSION)

    def _save(self, trainer) -> None:
        self._last_global_step_saved = trainer.global_step
        metrics = trainer.callback_metrics
        path = self._path(self.format_checkpoint_name(metrics, trainer.current_epoch, trainer.global_step))
        if self.monitor is not None:
            current = _monitored(trainer, "ModelCheckpoint", self.monitor)
            self._save_top_k(trainer, path, current)
        elif self.save_top_k != 0:
            previous = self.best_model_path
            trainer.save_checkpoint(path, weights_only=self.save_weights_only)
            self.best_model_path = path
            if self.save_top_k == 1 and previous and previous != path:
                trainer.remove_checkpoint(previous)
        if self.save_last:
            self.last_model_path = self._path(self.CHECKPOINT_NAME_LAST)
            trainer.save_checkpoint(self.last_model_path, weights_only=self.save_weights_only)

    def _save_top_k(self, trainer, path: str, current: float) -> None:
        if self.save_top_k == 0 or math.isnan(current):
            return
        better = (lambda a, b: a < b) if self.mode == "min" else (lambda a, b: a > b)
        if self.save_top_k != -1 and len(self.best_k_models) >= self.save_top_k:
            worst = max(self.best_k_models, key=self.best_k_models.get) if self.mode == "min" else \
                min(self.best_k_models, key=self.best_k_models.get)
            if not better(current, self.best_k_models[worst]):
                return
            del self.best_k_models[worst]
            if worst != path:
                trainer.remove_checkpoint(worst)
        self.best_k_models[path] = current
        trainer.save_checkpoint(path, weights_only=self.save_weights_only)
        best = (min if self.mode == "min" else max)(self.best_k_models, key=self.best_k_models.get)
        self.best_model_path, self.best_model_score = best, torch.tensor(self.best_k_models[best])


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


class TQDMProgressBar(Callback):
    """Lightning's progress-bar callback name: in ``callbacks`` it turns gpulayer's bar on (``refresh_rate=0``: off).

    gpulayer draws its own one-line bar from numbers already materialised at log
    intervals (``progress.py``); ``refresh_rate`` is accepted for compatibility and
    the bar redraws at most four times a second whatever it is.
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False):
        if not isinstance(refresh_rate, int) or refresh_rate < 0:
            raise TrainerConfigError(f"TQDMProgressBar(refresh_rate={refresh_rate!r}) must be an int >= 0")
        self.refresh_rate = refresh_rate
        self.process_position = process_position
        self.leave = leave


ProgressBar = TQDMProgressBar
RichProgressBar = TQDMProgressBar


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
