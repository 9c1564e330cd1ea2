"""``ModelCheckpoint``: save the top ``save_top_k`` checkpoints by ``monitor``, or the latest, and ``last.ckpt``.

Arguments, file names, timing and state follow Lightning's
``callbacks/model_checkpoint.py`` (2.6), whose rules this re-implements:
``filename="{epoch}-{val_loss:.2f}"`` gives ``epoch=3-val_loss=0.12.ckpt``
(default ``epoch={epoch}-step={step}``), a name taken twice gets ``-v1``,
``-v2``; saves happen at train-epoch end when validation runs once per epoch at
its end (or never), else after validation; ``every_n_train_steps`` and
``train_time_interval`` save at batch ends instead. Only global rank 0 writes.
"""

# no ``from __future__ import annotations``: the CLI (jsonargparse) reads ``__init__``'s annotations as types

import copy
import datetime
import os
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Literal

import torch

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.errors import MisconfigurationException


def _misconfigured(message: str) -> MisconfigurationException:
    from gpulayer.trainer.errors import TrainerConfigError
    return TrainerConfigError(message)


class ModelCheckpoint(Callback):
    """``ModelCheckpoint(dirpath=None, filename=None, monitor=None, save_top_k=1, mode="min", save_last=None, ...)``.

    >>> ckpt = ModelCheckpoint(dirpath="ckpts", filename="{epoch}-{val_loss:.2f}", monitor="val_loss", save_top_k=2)
    >>> trainer = Trainer(callbacks=[ckpt])                 # doctest: +SKIP
    >>> trainer.fit(model); ckpt.best_model_path            # doctest: +SKIP
    """

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1

    def __init__(self, dirpath: str | os.PathLike | None = None, filename: str | None = None, monitor: str | None = None,
                 verbose: bool = False, save_last: bool | Literal["link"] | None = None, save_top_k: int = 1,
                 save_on_exception: bool = False, save_weights_only: bool = False, mode: str = "min",
                 auto_insert_metric_name: bool = True, every_n_train_steps: int | None = None,
                 train_time_interval: datetime.timedelta | None = None, every_n_epochs: int | None = None,
                 save_on_train_epoch_end: bool | None = None, enable_version_counter: bool = True):
        if mode not in ("min", "max"):
            raise _misconfigured(f"`mode` can be min, max but got {mode} (ModelCheckpoint(mode={mode!r}); accepted values: 'min', 'max')")
        if save_last not in (None, True, False, "link"):
            raise _misconfigured(f"ModelCheckpoint(save_last={save_last!r}) must be None, True, False or 'link'")
        if train_time_interval is not None and not isinstance(train_time_interval, datetime.timedelta):
            raise _misconfigured(f"ModelCheckpoint(train_time_interval={train_time_interval!r}) must be a datetime.timedelta")
        self.monitor = monitor
        self.verbose = verbose
        self.save_last = save_last
        self.save_top_k = save_top_k
        self.save_on_exception = save_on_exception
        self.save_weights_only = save_weights_only
        self.auto_insert_metric_name = auto_insert_metric_name
        self.mode = mode
        self.kth_value = torch.tensor(torch.inf if mode == "min" else -torch.inf)
        self._save_on_train_epoch_end = save_on_train_epoch_end
        self._enable_version_counter = enable_version_counter
        self._last_global_step_saved = 0  # no need to save when no steps were taken
        self._last_time_checked: float | None = None
        self._defer_save_until_validation = False
        self.current_score: torch.Tensor | None = None
        self.best_k_models: dict[str, torch.Tensor] = {}
        self.kth_best_model_path = ""
        self.best_model_score: torch.Tensor | None = None
        self.best_model_path = ""
        self.last_model_path = ""
        self._last_checkpoint_saved = ""
        if dirpath and "://" not in os.fspath(dirpath):  # a URL (s3://...) is kept as given, as Lightning does
            dirpath = os.path.realpath(os.path.expanduser(os.fspath(dirpath)))
        elif dirpath:
            dirpath = os.fspath(dirpath)
        self.dirpath: str | None = dirpath
        self.filename = filename
        if every_n_train_steps is None and every_n_epochs is None and train_time_interval is None:
            every_n_epochs, every_n_train_steps = 1, 0
        self._train_time_interval = train_time_interval
        self._every_n_epochs: int = every_n_epochs or 0
        self._every_n_train_steps: int = every_n_train_steps or 0
        self._validate()

    def _validate(self) -> None:
        if not isinstance(self.save_top_k, int) or self.save_top_k < -1:
            raise _misconfigured(f"Invalid value for save_top_k={self.save_top_k}. Must be >= -1")
        if self._every_n_train_steps < 0:
            raise _misconfigured(f"Invalid value for every_n_train_steps={self._every_n_train_steps}. Must be >= 0")
        if self._every_n_epochs < 0:
            raise _misconfigured(f"Invalid value for every_n_epochs={self._every_n_epochs}. Must be >= 0")
        triggers = (self._every_n_train_steps >= 1) + (self._every_n_epochs >= 1) + (self._train_time_interval is not None)
        if triggers > 1:
            raise _misconfigured(
                f"Combination of parameters every_n_train_steps={self._every_n_train_steps}, "
                f"every_n_epochs={self._every_n_epochs} and train_time_interval={self._train_time_interval} "
                "should be mutually exclusive.")
        if self.monitor is None and self.save_top_k not in (-1, 0, 1):
            raise _misconfigured(
                f"ModelCheckpoint(save_top_k={self.save_top_k}, monitor=None) is not a valid configuration. No quantity "
                "for top_k to track; set monitor='val_loss' (or another logged metric) or save_top_k=1/-1")

    @property
    def every_n_epochs(self) -> int:
        return self._every_n_epochs

    @property
    def every_n_train_steps(self) -> int:
        return self._every_n_train_steps

    @property
    def state_key(self) -> str:
        return "ModelCheckpoint" + repr({
            "monitor": self.monitor, "mode": self.mode, "every_n_train_steps": self._every_n_train_steps,
            "every_n_epochs": self._every_n_epochs, "train_time_interval": self._train_time_interval,
        })

    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor, "best_model_score": self.best_model_score, "best_model_path": self.best_model_path,
                "current_score": self.current_score, "dirpath": self.dirpath, "best_k_models": dict(self.best_k_models),
                "kth_best_model_path": self.kth_best_model_path, "kth_value": self.kth_value,
                "last_model_path": self.last_model_path}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        dirpath_from_ckpt = state_dict.get("dirpath", self.dirpath)
        if self.dirpath is None or self.dirpath == dirpath_from_ckpt:
            self.dirpath = dirpath_from_ckpt
            self.best_model_score = state_dict.get("best_model_score")
            self.kth_best_model_path = state_dict.get("kth_best_model_path", self.kth_best_model_path)
            self.kth_value = state_dict.get("kth_value", self.kth_value)
            self.best_k_models = dict(state_dict.get("best_k_models", self.best_k_models))
            self.last_model_path = state_dict.get("last_model_path", self.last_model_path)
            self.current_score = state_dict.get("current_score", self.current_score)
        else:
            warnings.warn(f"The dirpath has changed from {dirpath_from_ckpt!r} to {self.dirpath!r}, therefore "
                          "`best_model_score`, `kth_best_model_path`, `kth_value`, `last_model_path` and "
                          "`best_k_models` won't be reloaded. Only `best_model_path` will be reloaded.", stacklevel=2)
        self.best_model_path = state_dict.get("best_model_path", "")

    # -- hooks ------------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        self.dirpath = self._resolve_dir(trainer)
        if trainer.is_global_zero and stage == "fit" and self.save_top_k != 0 and os.path.isdir(self.dirpath) \
                and os.listdir(self.dirpath):
            warnings.warn(f"Checkpoint directory {self.dirpath} exists and is not empty.", stacklevel=2)
        if self.save_last == "link" and "://" in str(self.dirpath) and not str(self.dirpath).startswith("file://"):
            # a symlink needs a local file system; remote URLs (s3://, memory://) have none
            raise ValueError(f"`ModelCheckpoint(save_last='link')` is only supported for local file paths, got "
                             f"`dirpath={self.dirpath}`. Use save_last=True to write last.ckpt as a copy.")

    def on_train_start(self, trainer, pl_module) -> None:
        self._last_time_checked = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        steps, interval = self._every_n_train_steps, self._train_time_interval
        if steps < 1 and interval is None:
            return  # the common case, once per batch: nothing to decide
        skip_batch = steps < 1 or trainer.global_step % steps != 0
        skip_time, now = True, time.monotonic()
        if interval is not None:
            prev = self._last_time_checked
            skip_time = prev is None or now - prev < interval.total_seconds()
            if trainer.world_size > 1:  # rank 0's clock decides for everyone, or the ranks could diverge
                skip_time = trainer.strategy.broadcast_flag(skip_time)
        if skip_batch and skip_time:
            return
        if not skip_time:
            self._last_time_checked = now
        candidates = self._monitor_candidates(trainer)
        if self.monitor is not None and self.monitor not in candidates:
            self._defer_save_until_validation = True  # a validation-only metric: save once validation has it
            return
        if self.monitor is not None and not self._should_save_on_train_epoch_end(trainer) \
                and trainer.loop is not None and trainer.loop.is_last_batch(batch_idx) and trainer.loop.validates_at_epoch_end():
            self._defer_save_until_validation = True  # validation right after this batch: use its fresh value
            return
        if self._should_skip_saving_checkpoint(trainer):
            return
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not self._should_skip_saving_checkpoint(trainer) and self._should_save_on_train_epoch_end(trainer):
            self._save_at_epoch_end(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._should_skip_saving_checkpoint(trainer) or self._should_save_on_train_epoch_end(trainer):
            return
        if self._defer_save_until_validation:
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
            self._defer_save_until_validation = False
            return
        self._save_at_epoch_end(trainer)

    def _save_at_epoch_end(self, trainer) -> None:
        candidates = self._monitor_candidates(trainer)
        if self._every_n_epochs >= 1 and (trainer.current_epoch + 1) % self._every_n_epochs == 0:
            self._save_topk_checkpoint(trainer, candidates)
        if self._last_global_step_saved == trainer.global_step or (self.save_last == "link" and self._last_checkpoint_saved):
            self._save_last_checkpoint(trainer, candidates)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not (self.save_on_exception and not trainer.fast_dev_run and not trainer.sanity_checking
                and self._last_global_step_saved != trainer.global_step):
            return
        candidates = self._monitor_candidates(trainer)
        self._save_checkpoint(trainer, self.format_checkpoint_name(metrics=candidates))
        self._save_last_checkpoint(trainer, candidates)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.save_last and not self._last_checkpoint_saved:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    # -- when ---------------------------------------------------------------------------------------
    def _should_skip_saving_checkpoint(self, trainer) -> bool:
        return (bool(trainer.fast_dev_run) or trainer.state_stage != "fit" or trainer.sanity_checking
                or self._last_global_step_saved == trainer.global_step)

    def _should_save_on_train_epoch_end(self, trainer) -> bool:
        if self._save_on_train_epoch_end is not None:
            return self._save_on_train_epoch_end
        if trainer.check_val_every_n_epoch != 1:
            return False
        if not trainer.has_val_loader or sum(trainer.num_val_batches) == 0:
            return True
        return trainer.val_check_interval == 1.0

    # -- names --------------------------------------------------------------------------------------
    def _format_checkpoint_name(self, filename: str | None, metrics: dict[str, Any], prefix: str | None = None,
                                auto_insert_metric_name: bool = True) -> str:
        if not filename:
            filename = "{epoch}" + self.CHECKPOINT_JOIN_CHAR + "{step}"
        groups = re.findall(r"(\{.*?)[:\}]", filename)
        # longest first, so "epoch" does not replace part of "epoch_test"
        for group in sorted(groups, key=len, reverse=True):
            name = group[1:]
            if auto_insert_metric_name:
                filename = filename.replace(group, name + self.CHECKPOINT_EQUALS_CHAR + "{" + name)
            filename = filename.replace(group, f"{{0[{name}]")  # names with dots or slashes
            if name not in metrics:
                metrics[name] = torch.tensor(0)
        filename = filename.format(metrics)
        if prefix is not None:
            filename = self.CHECKPOINT_JOIN_CHAR.join([prefix, filename])
        return filename

    def format_checkpoint_name(self, metrics: dict[str, Any], filename: str | None = None, ver: int | None = None,
                               prefix: str | None = None) -> str:
        """The path for ``metrics``: ``ModelCheckpoint(filename='{epoch}-{val_loss:.2f}')`` -> ``epoch=2-val_loss=0.12.ckpt``."""
        filename = self._format_checkpoint_name(filename or self.filename, metrics, prefix=prefix,
                                                auto_insert_metric_name=self.auto_insert_metric_name)
        if ver is not None:
            filename = self.CHECKPOINT_JOIN_CHAR.join((filename, f"v{ver}"))
        name = f"{filename}{self.FILE_EXTENSION}"
        return os.path.join(self.dirpath, name) if self.dirpath else name

    def _resolve_dir(self, trainer) -> str:
        """``dirpath``, else the logger's ``save_dir/name/version_N/checkpoints``, else ``default_root_dir/checkpoints``."""
        if self.dirpath is not None:
            return self.dirpath
        if trainer.loggers:
            lg = trainer.loggers[0]
            save_dir = lg.save_dir if lg.save_dir is not None else trainer.default_root_dir
            version = lg.version if isinstance(lg.version, str) else f"version_{lg.version}"
            return os.path.join(save_dir, str(lg.name), version, "checkpoints")
        return os.path.join(trainer.default_root_dir, "checkpoints")

    def _find_last_checkpoints(self, trainer) -> set[str]:
        path = self._resolve_dir(trainer)
        pattern = rf"^{self.CHECKPOINT_NAME_LAST}(-(\d+))?"
        if not os.path.isdir(path):
            return set()
        return {os.path.normpath(os.path.join(path, p)) for p in os.listdir(path)
                if Path(p).suffix == self.FILE_EXTENSION and re.match(pattern, Path(p).stem)}

    def _get_metric_interpolated_filepath_name(self, candidates: dict[str, Any], trainer, del_filepath: str | None = None) -> str:
        filepath = self.format_checkpoint_name(candidates)
        if self._enable_version_counter:
            version = self.STARTING_VERSION
            while self.file_exists(filepath, trainer) and filepath != del_filepath:
                filepath = self.format_checkpoint_name(candidates, ver=version)
                version += 1
        return filepath

    def _monitor_candidates(self, trainer) -> dict[str, Any]:
        candidates = copy.deepcopy(trainer.callback_metrics)
        epoch, step = candidates.get("epoch"), candidates.get("step")
        candidates["epoch"] = epoch.int() if isinstance(epoch, torch.Tensor) else torch.tensor(trainer.current_epoch)
        candidates["step"] = step.int() if isinstance(step, torch.Tensor) else torch.tensor(trainer.global_step)
        return candidates

    # -- saving -------------------------------------------------------------------------------------
    def _save_topk_checkpoint(self, trainer, candidates: dict[str, Any]) -> None:
        if self.save_top_k == 0:
            return
        if self.monitor is None:
            self._save_none_monitor_checkpoint(trainer, candidates)
            return
        if self.monitor not in candidates:
            m = (f"`ModelCheckpoint(monitor={self.monitor!r})` could not find the monitored key in the returned metrics: "
                 f"{list(candidates)}. HINT: Did you call `log({self.monitor!r}, value)` in the `LightningModule`?")
            if trainer.val_has_run:  # Lightning raises only once validation could have logged it
                raise _misconfigured(m)
            warnings.warn(m, stacklevel=2)
        self._save_monitor_checkpoint(trainer, candidates)

    def check_monitor_top_k(self, trainer, current: torch.Tensor | None = None) -> bool:
        if current is None:
            return False
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        op = torch.lt if self.mode == "min" else torch.gt
        better = bool(op(torch.as_tensor(current), self.best_k_models[self.kth_best_model_path]))
        return trainer.strategy.all(better) if trainer.world_size > 1 else better

    def _save_monitor_checkpoint(self, trainer, candidates: dict[str, Any]) -> None:
        current = candidates.get(self.monitor)
        if self.check_monitor_top_k(trainer, current):
            self._update_best_and_save(torch.as_tensor(current), trainer, candidates)
        elif self.verbose and trainer.is_global_zero:
            print(f"Epoch {int(candidates['epoch']):d}, global step {int(candidates['step']):d}: {self.monitor!r} was not "
                  f"in top {self.save_top_k}")

    def _save_none_monitor_checkpoint(self, trainer, candidates: dict[str, Any]) -> None:
        filepath = self._get_metric_interpolated_filepath_name(candidates, trainer, self.best_model_path)
        previous, self.best_model_path = self.best_model_path, filepath  # before saving: it is part of the state
        self._save_checkpoint(trainer, filepath)
        if self.save_top_k == 1 and previous and self._should_remove_checkpoint(trainer, previous, filepath):
            self._remove_checkpoint(trainer, previous)

    def _update_best_and_save(self, current: torch.Tensor, trainer, candidates: dict[str, Any]) -> None:
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        del_filepath = None
        if len(self.best_k_models) == k and k > 0:
            del_filepath = self.kth_best_model_path
            self.best_k_models.pop(del_filepath)
        if torch.isnan(current):  # never keep nan as a score: it would compare as neither better nor worse
            current = torch.tensor(float("inf" if self.mode == "min" else "-inf"), device=current.device)
        filepath = self._get_metric_interpolated_filepath_name(candidates, trainer, del_filepath)
        self.current_score = current
        self.best_k_models[filepath] = current
        if len(self.best_k_models) == k:
            worst = max if self.mode == "min" else min
            self.kth_best_model_path = worst(self.best_k_models, key=self.best_k_models.get)
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        best = min if self.mode == "min" else max
        self.best_model_path = best(self.best_k_models, key=self.best_k_models.get)
        self.best_model_score = self.best_k_models[self.best_model_path]
        if self.verbose and trainer.is_global_zero:
            print(f"Epoch {int(candidates['epoch']):d}, global step {int(candidates['step']):d}: {self.monitor!r} reached "
                  f"{float(current):0.5f} (best {float(self.best_model_score):0.5f}), saving model to {filepath!r} as top {k}")
        self._save_checkpoint(trainer, filepath)
        if del_filepath and self._should_remove_checkpoint(trainer, del_filepath, filepath):
            self._remove_checkpoint(trainer, del_filepath)

    def _save_last_checkpoint(self, trainer, candidates: dict[str, Any]) -> None:
        if not self.save_last:
            return
        filepath = self.format_checkpoint_name(candidates, self.CHECKPOINT_NAME_LAST)
        if self._enable_version_counter:
            version = self.STARTING_VERSION
            while self.file_exists(filepath, trainer) and filepath != self.last_model_path:
                filepath = self.format_checkpoint_name(candidates, self.CHECKPOINT_NAME_LAST, ver=version)
                version += 1
        previous, self.last_model_path = self.last_model_path, filepath
        if self.save_last == "link" and self._last_checkpoint_saved and self.save_top_k != 0:
            self._link_checkpoint(trainer, self._last_checkpoint_saved, filepath)
        else:
            self._save_checkpoint(trainer, filepath)
        if previous and self._should_remove_checkpoint(trainer, previous, filepath):
            self._remove_checkpoint(trainer, previous)

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        trainer.save_checkpoint(filepath, self.save_weights_only)
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        for logger in trainer.loggers:  # loggers that upload checkpoints hear of each one (Lightning's hook)
            hook = getattr(logger, "after_save_checkpoint", None)  # a duck-typed logger may lack it
            if callable(hook):
                hook(self)

    @staticmethod
    def _link_checkpoint(trainer, filepath: str, linkpath: str) -> None:
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            if os.path.islink(linkpath) or os.path.isfile(linkpath):
                os.remove(linkpath)
            elif os.path.isdir(linkpath):
                shutil.rmtree(linkpath)
            try:
                os.symlink(os.path.relpath(filepath, os.path.dirname(linkpath)), linkpath)
            except OSError:
                shutil.copy(filepath, linkpath)
        trainer.strategy.barrier()

    def file_exists(self, filepath: str, trainer) -> bool:
        """Rank 0 looks; every rank gets its answer (so their states cannot diverge)."""
        exists = os.path.exists(filepath) if trainer.is_global_zero else False
        return trainer.strategy.any(exists) if trainer.world_size > 1 else exists

    def _should_remove_checkpoint(self, trainer, previous: str, current: str) -> bool:
        """Not the file just written, not the file this fit resumed from, and only inside ``dirpath``."""
        if previous == current:
            return False
        previous_path = Path(previous).absolute()
        resume = getattr(trainer, "ckpt_path", None)
        if resume is not None and previous_path == Path(resume).absolute():
            return False
        return Path(self.dirpath).absolute() in previous_path.parents

    def _remove_checkpoint(self, trainer, filepath: str) -> None:
        trainer.remove_checkpoint(filepath)

    def to_yaml(self, filepath: str | os.PathLike | None = None) -> None:
        """Write ``best_k_models`` (path -> score) as YAML, ``dirpath/best_k_models.yaml`` by default."""
        path = os.fspath(filepath) if filepath is not None else os.path.join(self.dirpath, "best_k_models.yaml")
        from gpulayer.trainer.core.saving import _plain_yaml
        best_k = {k: float(v) for k, v in self.best_k_models.items()}
        try:
            import yaml
            text = yaml.dump(best_k)
        except ImportError:  # PyYAML is optional: the same layout for these plain values
            text = _plain_yaml(best_k)
        with open(path, "w") as f:
            f.write(text)
