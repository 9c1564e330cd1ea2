"""``Tuner(trainer)``: ``lr_find`` and ``scale_batch_size`` as Lightning documents them (``tuner.tuning``)."""

from __future__ import annotations

import copy
import dataclasses
import gc
import warnings
from typing import Any, Callable

import torch

from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.profilers import PassThroughProfiler
from gpulayer.trainer.tuner import attributes
from gpulayer.trainer.tuner.lr_finder import LRFinder, LRSearch, lr_schedule
from gpulayer.trainer.utilities.rank_zero import rank_zero_info

METHODS = ("fit", "validate", "test", "predict")
_OOM_TEXTS = ("out of memory", "CUDNN_STATUS_NOT_SUPPORTED", "CUDNN_STATUS_EXECUTION_FAILED",
              "can't allocate memory")


def is_oom(err: BaseException) -> bool:
    """A failure of memory (CUDA's or the CPU allocator's), which a smaller batch avoids."""
    return isinstance(err, torch.cuda.OutOfMemoryError) or \
        isinstance(err, RuntimeError) and any(text in str(err) for text in _OOM_TEXTS)


def _check_method(method: str, train: Any, val: Any, dataloaders: Any) -> None:
    if method not in METHODS:
        raise ValueError(f"method {method!r} is invalid. Should be one of {METHODS}.")
    if method == "fit" and dataloaders is not None:
        raise MisconfigurationException(f"In tuner with method={method!r}, `dataloaders` argument should be None, "
                                        "please consider setting `train_dataloaders` and `val_dataloaders` instead.")
    if method != "fit" and (train is not None or val is not None):
        raise MisconfigurationException(
            f"In tuner with `method`={method!r}, `train_dataloaders` and `val_dataloaders` arguments should be None, "
            "please consider setting `dataloaders` instead.")


class Tuner:
    """Searches that run short trial fits on ``trainer``'s settings and leave the model's weights as they were."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    # -- trials ----------------------------------------------------------------------------------
    def _trial(self, model: Any, callbacks: list, **overrides: Any) -> Any:
        """A Trainer for one trial: the user's settings, but quiet (no logger, checkpoints, bar, summary)."""
        from gpulayer.trainer.trainer import Trainer
        cfg = dataclasses.replace(self._trainer.config, callbacks=list(callbacks), loggers=[],
                                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                  num_sanity_val_steps=0, profiler=PassThroughProfiler(), **overrides)
        return Trainer.from_config(cfg)

    def _guarded(self, model: Any, search: Callable[[], Any]) -> Any:
        """Run ``search``; the model's weights and Trainer reference are put back whatever happens."""
        if self._trainer.config.multi_process:
            raise ValueError("Tuning is currently not supported with distributed strategies: tune with devices=1, "
                             "then train with the values found.")
        weights = copy.deepcopy(model.state_dict())
        attached = model._trainer
        try:
            return search()
        finally:
            model.load_state_dict(weights)
            model._trainer = attached

    # -- learning rate -----------------------------------------------------------------------------
    def lr_find(self, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None, dataloaders: Any = None,
                datamodule: Any = None, method: str = "fit", min_lr: float = 1e-8, max_lr: float = 1,
                num_training: int = 100, mode: str = "exponential", early_stop_threshold: float | None = 4.0,
                update_attr: bool = True, attr_name: str = "") -> LRFinder | None:
        """Train ``num_training`` steps with a learning rate growing from ``min_lr`` to ``max_lr``; return the
        ``LRFinder`` (``results``, ``suggestion()``, ``plot()``). With ``update_attr`` the suggestion is written to
        the model's ``lr`` / ``learning_rate`` (or ``attr_name``)."""
        if method != "fit":
            raise MisconfigurationException("method='fit' is the only valid configuration to run lr finder.")
        _check_method(method, train_dataloaders, val_dataloaders, dataloaders)
        if self._trainer.fast_dev_run:
            warnings.warn("Skipping learning rate finder since `fast_dev_run` is enabled.", UserWarning, stacklevel=2)
            return None
        if update_attr:
            attr_name = self._lr_attr(model, datamodule, attr_name)
        finder = LRFinder(mode, min_lr, max_lr, num_training)
        search = LRSearch(lr_schedule(mode, min_lr, max_lr, num_training), early_stop_threshold)

        def run() -> None:
            trial = self._trial(model, [search], max_steps=num_training, limit_val_batches=0)
            trial.fit(model, train_dataloaders, val_dataloaders, datamodule)
            if trial.global_step < num_training:
                rank_zero_info(f"LR finder stopped early after {trial.global_step} steps due to diverging loss.")

        self._guarded(model, run)
        finder.results = {"lr": search.lrs[:len(search.losses)], "loss": search.losses}
        if update_attr:
            lr = finder.suggestion()
            if lr is not None:
                attributes.put(model, datamodule, attr_name, lr)
                rank_zero_info(f"Learning rate set to {lr}")
        return finder

    @staticmethod
    def _lr_attr(model: Any, datamodule: Any, attr_name: str) -> str:
        if attr_name:
            if not attributes.holders(model, None, attr_name):
                raise AttributeError(f"The attribute name for the learning rate was set to {attr_name}, but could not "
                                     "find this as a field in `model` or `model.hparams`.")
            return attr_name
        for name in ("lr", "learning_rate"):
            if attributes.holders(model, None, name):
                return name
        raise AttributeError("When using the learning rate finder, either `model` or `model.hparams` should have one "
                             "of these fields: ('lr', 'learning_rate'). If your model has a different name for the "
                             "learning rate, set it with `.lr_find(attr_name=...)`.")

    # -- batch size --------------------------------------------------------------------------------
    def scale_batch_size(self, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None,
                         dataloaders: Any = None, datamodule: Any = None, method: str = "fit", mode: str = "power",
                         steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
                         batch_arg_name: str = "batch_size", margin: float = 0.05, max_val: int = 8192) -> int | None:
        """The largest batch size (up to ``max_val``) with which ``steps_per_trial`` steps of ``method`` run without
        running out of memory; it is written to ``batch_arg_name`` (model, its hparams or the datamodule).

        ``mode="power"`` doubles from ``init_val`` until a trial fails; ``"binsearch"`` then bisects between the last
        success and the failure, and takes ``margin`` off the result.
        """
        _check_method(method, train_dataloaders, val_dataloaders, dataloaders)
        if mode not in ("power", "binsearch"):
            raise ValueError(f"scale_batch_size(mode={mode!r}) should be either of `power` or `binsearch`")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"`margin` should be between 0 and 1. Found margin={margin}")
        if self._trainer.fast_dev_run:
            warnings.warn("Skipping batch size scaler since `fast_dev_run` is enabled.", UserWarning, stacklevel=2)
            return None
        if train_dataloaders is not None or val_dataloaders is not None or dataloaders is not None:
            raise MisconfigurationException(
                "The batch scaling feature cannot be used with dataloaders passed directly to `.fit()`. Please disable "
                "the feature or incorporate the dataloader into your LightningModule or LightningDataModule.")
        if not attributes.holders(model, datamodule, batch_arg_name):
            raise MisconfigurationException(f"Field {batch_arg_name} not found in `model`, `datamodule`, nor their "
                                            "`hparams` attributes.")
        from gpulayer.trainer.tuner.batch_size import search_batch_size

        def trial(size: int) -> None:
            attributes.put(model, datamodule, batch_arg_name, size)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if method == "fit":
                self._trial(model, [], max_steps=steps_per_trial, limit_train_batches=1.0,
                            limit_val_batches=steps_per_trial).fit(model, datamodule=datamodule)
            else:
                limits = {f"limit_{'val' if method == 'validate' else method}_batches": steps_per_trial}
                runner = getattr(self._trial(model, [], **limits), method)
                runner(model, datamodule=datamodule, **({} if method == "predict" else {"verbose": False}))

        def run() -> int:
            return search_batch_size(trial, lambda: self._dataset_length(model, datamodule, method), mode, init_val,
                                     max_trials, margin, max_val, is_oom)

        size = self._guarded(model, run)
        attributes.put(model, datamodule, batch_arg_name, size)
        rank_zero_info(f"Finished batch size finder, will continue with full run using batch size {size}")
        return size

    @staticmethod
    def _dataset_length(model: Any, datamodule: Any, method: str) -> float:
        """Samples in the data of ``method`` (inf when unknown): a batch size beyond it tests nothing new."""
        hook = {"fit": "train_dataloader", "validate": "val_dataloader"}.get(method, f"{method}_dataloader")
        owner = datamodule if datamodule is not None else model
        try:
            loader = getattr(owner, hook)()
            return float(len(loader.dataset))
        except Exception:  # no such hook, an iterable dataset, no dataset attribute: unknown
            return float("inf")
