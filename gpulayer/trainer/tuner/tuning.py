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
from gpulayer.trainer.tuner.lr_finder import LRFinder, LRSearch, lr_schedule, rng_kept
from gpulayer.trainer.utilities.rank_zero import rank_zero_info

METHODS = ("fit", "validate", "test", "predict")


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
        cfg = dataclasses.replace(self._trainer.config, callbacks=list(callbacks), loggers=[],
                                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                  num_sanity_val_steps=0, profiler=PassThroughProfiler(), **overrides)
        return type(self._trainer).from_config(cfg)  # the user's Trainer class, as theirs was built

    def _guarded(self, model: Any, search: Callable[[], Any]) -> Any:
        """Run ``search``; the model's weights and Trainer reference are put back whatever happens."""
        if self._trainer.config.multi_process:
            raise ValueError("Tuning is currently not supported with distributed strategies: tune with devices=1, "
                             "then train with the values found.")
        weights = copy.deepcopy(model.state_dict())
        # what a run attaches to the module: a search inside a running fit (the callbacks) hands them back to it
        attached = {name: getattr(model, name, None) for name in ("_trainer", "_metric_store", "_device")}
        try:
            return search()
        finally:
            model.load_state_dict(weights)
            # a module tuned outside a run ends attached to the user's Trainer, as Lightning's (whose trials run on
            # that Trainer): model.logger is trainer.logger afterwards, not the quiet trial's
            attached["_trainer"] = attached["_trainer"] or self._trainer
            model.trainer = attached["_trainer"]  # the setter reaches nested modules too
            for name, value in attached.items():
                setattr(model, name, value)

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

        with rng_kept():  # the search leaves the random state as it found it: a second call finds the same
            self._guarded(model, run)
        finder.results = {"lr": search.lrs[:len(search.losses)], "loss": search.losses}
        finder._total_batch_idx = search.batches - 1  # Lightning's count: the last training batch's index
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
        check_batch_size_search(self._trainer, model, datamodule, mode, margin, batch_arg_name,
                                given=(train_dataloaders, val_dataloaders, dataloaders), method=method)
        if self._trainer.fast_dev_run:
            warnings.warn("Skipping batch size scaler since `fast_dev_run` is enabled.", UserWarning, stacklevel=2)
            return None
        from gpulayer.trainer.tuner.batch_size_scaling import BatchSizeProbe, search_batch_size

        def trial(size: int) -> None:
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

        probe = BatchSizeProbe(trial=trial, current=lambda: attributes.get(model, datamodule, batch_arg_name),
                               put=lambda size: attributes.put(model, datamodule, batch_arg_name, size),
                               dataset_length=lambda: self._dataset_length(model, datamodule, method))
        size = self._guarded(model, lambda: search_batch_size(probe, mode, init_val, max_trials, margin, max_val))
        attributes.put(model, datamodule, batch_arg_name, size)
        self._refresh_loaders(model, datamodule, method)
        rank_zero_info(f"Finished batch size finder, will continue with full run using batch size {size}")
        return size

    def _refresh_loaders(self, model: Any, datamodule: Any, method: str) -> None:
        """The trainer's loaders of ``method`` requested again at the size found (Lightning resets them)."""
        trainer = self._trainer
        owner = datamodule if datamodule is not None else model
        if datamodule is not None:
            trainer.datamodule = datamodule
        hook = {"fit": "train_dataloader", "validate": "val_dataloader"}.get(method, f"{method}_dataloader")
        loader = self._request(owner, hook)
        if method == "fit":
            trainer.loaders.train = loader
            val = self._request(owner, "val_dataloader")
            if val is not None:
                trainer.loaders.stages["validate"] = val
        elif loader is not None:
            trainer.loaders.stages[method] = loader

    @staticmethod
    def _request(owner: Any, hook: str) -> Any:
        from gpulayer.trainer.fit_data import _hook_source
        source = _hook_source(owner, hook)
        return source() if source is not None else None

    @staticmethod
    def _eval_loader_count(model: Any, datamodule: Any, method: str) -> int:
        hook = {"validate": "val_dataloader"}.get(method, f"{method}_dataloader")
        loaders = Tuner._request(datamodule if datamodule is not None else model, hook)
        return len(loaders) if isinstance(loaders, (list, tuple)) else 1

    @staticmethod
    def _dataset_length(model: Any, datamodule: Any, method: str) -> float | None:
        """Samples in the data of ``method`` (None when unknown): a batch size beyond it tests nothing new."""
        hook = {"fit": "train_dataloader", "validate": "val_dataloader"}.get(method, f"{method}_dataloader")
        owner = datamodule if datamodule is not None else model
        try:
            loader = getattr(owner, hook)()
            return float(len(loader.dataset))
        except Exception:  # no such hook, an iterable dataset, no dataset attribute: unknown
            return None


def check_batch_size_search(trainer: Any, model: Any, datamodule: Any, mode: str, margin: float, batch_arg_name: str,
                            given: tuple = (), method: str | None = None) -> None:
    """What Lightning refuses (or warns of) before a batch-size search, with its messages."""
    if mode not in ("power", "binsearch"):
        raise ValueError("`mode` should be either of ('power', 'binsearch')")
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"`margin` should be between 0 and 1. Found margin={margin}")
    if trainer.config.multi_process:
        raise MisconfigurationException("The Batch size finder is not supported with distributed strategies.")
    if any(x is not None for x in given):
        raise MisconfigurationException(
            "The Batch size finder cannot be used with dataloaders passed directly to `.fit()`. Please disable the "
            "feature or incorporate the dataloader into your LightningModule or LightningDataModule.")
    if method not in (None, "fit") and Tuner._eval_loader_count(model, datamodule, method) > 1:
        stage = {"validate": "val"}.get(method, method)
        raise MisconfigurationException(f"The Batch size finder cannot be used with multiple {stage} dataloaders.")
    if not attributes.holders(model, datamodule, batch_arg_name):
        raise MisconfigurationException(f"Field {batch_arg_name} not found in `model`, `datamodule`, nor their "
                                        "`hparams` attributes.")
    hparams = getattr(model, "hparams", None) if attributes._has_hparams(model) else None
    if batch_arg_name in getattr(model, "__dict__", {}) and hparams is not None and batch_arg_name in hparams:
        warnings.warn(f"Field `model.{batch_arg_name}` and `model.hparams.{batch_arg_name}` are mutually exclusive! "
                      f"`model.{batch_arg_name}` will be used as the initial batch size for scaling. If this is not "
                      "the intended behavior, please remove either one.", UserWarning, stacklevel=3)
