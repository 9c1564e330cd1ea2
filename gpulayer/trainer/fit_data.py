"""Where a fit's loaders come from, when they are requested again, and how many batches they give.

Lightning's data rules for ``fit``: each loader has a source (what was passed to ``fit``, else the
datamodule, else the module's ``*_dataloader()`` hook); ``val_dataloader`` is requested before
``train_dataloader`` (the sanity check needs it first) and only when validation can run
(``validation_step`` defined, ``limit_val_batches > 0``); several train loaders become one
``CombinedLoader`` (``max_size_cycle``); ``overfit_batches`` turns shuffling off;
``reload_dataloaders_every_n_epochs`` requests them again; ``val_check_interval`` becomes a
batch count here (``val_check_batch``), refused when it cannot be met.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from gpulayer.trainer import data, evaluate, profilers
from gpulayer.trainer.errors import TrainerConfigError
from gpulayer.trainer.stage_aids import hook_action
from gpulayer.trainer.states import RunningStage
from gpulayer.trainer.utilities.rank_zero import rank_zero_warn
from gpulayer.trainer.utilities.warnings import PossibleUserWarning

Source = Callable[[], Any]


@dataclasses.dataclass
class Loaders:
    """The loaders a Trainer's runs used (``trainer.loaders``), behind Lightning's ``train_dataloader``,
    ``val_dataloaders``, ``num_sanity_val_batches``... properties."""

    train: Any = None  # the fit's train loader as the loop iterates it (a CombinedLoader for several)
    train_source: Source | None = None  # a zero-argument function that requests it again
    fit_val_batches: list = dataclasses.field(default_factory=list)  # num_val_batches of the fit's val loaders
    stages: dict = dataclasses.field(default_factory=dict)  # "validate" / "test" / "predict" -> the loaders used
    fit_given: tuple = (None, None)  # the train and val loaders fit() was given (trial fits of the tuner's callbacks)


def _hook_source(owner: Any, name: str) -> Source | None:
    """``owner.<name>()`` as a source, or None when the owner does not define that hook."""
    from gpulayer.trainer.datamodule import LightningDataModule
    from gpulayer.trainer.module import Module
    base = LightningDataModule if isinstance(owner, LightningDataModule) else Module
    if name in vars(owner) and vars(owner)[name] is not None:
        return vars(owner)[name]
    impl = getattr(type(owner), name, None)
    if impl is None or impl is getattr(base, name, None):
        return None
    return getattr(owner, name)


def sources(module: Any, train: Any, val: Any, datamodule: Any) -> tuple[Source | None, Source | None]:
    """The zero-argument functions that give the fit's train and val loaders (as Lightning attaches them)."""
    if datamodule is not None:
        return _hook_source(datamodule, "train_dataloader"), _hook_source(datamodule, "val_dataloader")
    train_src = (lambda: data.resolve(train)) if train is not None else _hook_source(module, "train_dataloader")
    val_src = (lambda: data.resolve(val)) if val is not None else _hook_source(module, "val_dataloader")
    return train_src, val_src


class FitData:
    """The loaders of one fit: requested in Lightning's order, reloaded every n epochs when asked."""

    def __init__(self, trainer: Any, module: Any, train: Any, val: Any, datamodule: Any) -> None:
        self.trainer, self.module, self.cfg = trainer, module, trainer.config
        self.train_source, self.val_source = sources(module, train, val, datamodule)
        # Trainer(profiler=...): the loader hooks are recorded too
        wrap = profilers.wrapper(getattr(trainer, "profiler", None))
        owner = datamodule if datamodule is not None else module
        if self.train_source is not None and (datamodule is not None or train is None):
            self.train_source = wrap(self.train_source, hook_action(owner, "train_dataloader"))
        if self.val_source is not None and (datamodule is not None or val is None):
            self.val_source = wrap(self.val_source, hook_action(owner, "val_dataloader"))
        trainer.loaders.train_source = self.train_source
        self.train_loaded_epoch: float = 0
        self.val_loaded_epoch: float = -math.inf  # never: the first validating epoch requests them
        self.val_loaded = False
        trainer.has_val_loader = self.validation_possible()

    # Lightning's order of a fit's first requests: with a sanity check, the val loaders inside it (after
    # ``on_sanity_check_start``, under the random state the check puts back afterwards, so a ``RandomDataset``
    # made in ``train_dataloader()`` holds the same numbers as without one), then the train loader; the val
    # loaders after it when no sanity check requested them and the first epoch validates (FitLoop.run).
    def load_sanity_val(self) -> list:
        """The val loaders, requested by the sanity check (counted as a request of an epoch that validates)."""
        return self._load_val_as(RunningStage.SANITY_CHECKING, record=self.val_epoch())

    def first_val_due(self) -> bool:
        """No val loaders requested yet, and the first epoch validates: request them before ``on_train_start``."""
        return not self.val_loaded and self.validation_possible() and self.val_epoch()

    def val_epoch(self) -> bool:
        """``check_val_every_n_epoch`` lets validation run in the current epoch."""
        n = self.cfg.check_val_every_n_epoch
        return n is None or (self.trainer.current_epoch + 1) % n == 0

    def reload_val(self) -> list:
        """At a validating epoch's start: the val loaders requested again (first load, or every n epochs)."""
        return self._load_val_as(RunningStage.VALIDATING)

    def _load_val_as(self, stage: RunningStage, record: bool = True) -> list:
        """``load_val`` with ``trainer.state.stage`` showing why the loaders are requested (the hooks read it)."""
        t = self.trainer
        before, t.state.stage = t.state.stage, stage
        try:
            return self.load_val(record)
        finally:
            t.state.stage = before

    # -- validation loaders ----------------------------------------------------------------------
    def validation_possible(self) -> bool:
        return self.val_source is not None and evaluate.defines(self.module, "validation_step") \
            and self.cfg.limit_val_batches > 0

    def load_val(self, record: bool = True) -> list:
        """Request the val loaders (or none, when validation cannot run), prepared for this process.

        ``record``: the request counts for ``reload_dataloaders_every_n_epochs`` (Lightning does not count a
        sanity check's request made in an epoch that does not validate).
        """
        t = self.trainer
        self.val_loaded = True
        if not self.validation_possible():
            t.has_val_loader, t.num_val_batches, t.loaders.fit_val_batches = False, [], []
            return []
        given = self.val_source()
        loaders = data.as_list(given)
        if self.cfg.overfit_batches > 0:
            loaders = [data.without_shuffle(dl, "val") for dl in loaders]
        loaders = [data.distribute(t, dl, "eval") for dl in loaders]
        for dl in loaders:
            data.seed_workers(dl)
        t.has_val_loader = bool(loaders)
        t.loaders.stages["validate"] = data.as_given(given, loaders) if loaders else None
        for dl in loaders:
            data.check_lengths(dl, t)
        t.num_val_batches = t.loaders.fit_val_batches = data.stage_counts(loaders, self.cfg.limit_val_batches, "val")
        if record:
            self.val_loaded_epoch = t.current_epoch
        return loaders

    def val_reload_due(self) -> bool:
        n = self.cfg.reload_dataloaders_every_n_epochs
        return bool(n) and self.trainer.current_epoch - self.val_loaded_epoch >= n

    # -- the train loader ---------------------------------------------------------------------------
    def load_train(self) -> Any:
        """Request the train loader(s): one loader, or a CombinedLoader for several; sets the batch counts."""
        t, cfg = self.trainer, self.cfg
        if cfg.limit_train_batches == 0:  # Lightning does not even request it: no training this fit
            loader: Any = []
        else:
            if self.train_source is None:
                raise TrainerConfigError(
                    "no training data: pass train_dataloaders to fit(model, train_loader) or define "
                    "train_dataloader() on the module")
            loader = data.combine_train(self.train_source())
            if loader is None:
                raise TrainerConfigError(
                    "train_dataloader() returned None; return a DataLoader (or a list / dict of them)")
            if cfg.overfit_batches > 0:
                loader = data.without_shuffle(loader, "train")
            if isinstance(loader, data.CombinedLoader):
                loader.flattened = [data.distribute(t, dl, "train") for dl in loader.flattened]
            else:
                loader = data.distribute(t, loader, "train")
            data.seed_workers(loader)
            data.check_lengths(loader, t)
        t.loaders.train = loader
        t.num_training_batches = data.num_batches(loader, cfg.limit_train_batches, "train")
        if t.loggers and 0 < t.num_training_batches < cfg.log_every_n_steps and not cfg.fast_dev_run:
            rank_zero_warn(
                f"The number of training batches ({t.num_training_batches}) is smaller than the logging interval "
                f"Trainer(log_every_n_steps={cfg.log_every_n_steps}). Set a lower value for log_every_n_steps if you "
                "want to see logs for the training epoch.", category=PossibleUserWarning)
        if isinstance(loader, data.CombinedLoader) and loader._mode == "sequential":
            raise TrainerConfigError(
                '`FitLoop` does not support the `CombinedLoader(mode="sequential")` mode: a training step takes a '
                'batch of every loader; use mode "max_size_cycle", "max_size" or "min_size"')
        self.train_loaded_epoch = t.current_epoch
        t.val_check_batch = self.val_check_batch(t.num_training_batches)
        return loader

    def train_reload_due(self) -> bool:
        n = self.cfg.reload_dataloaders_every_n_epochs
        return bool(n) and self.trainer.current_epoch - self.train_loaded_epoch >= n

    def val_check_batch(self, total: float) -> float:
        """Validate every this many train batches (``inf``: at the end of an unsized epoch), Lightning's rule."""
        cfg, vci = self.cfg, self.cfg.val_check_interval
        if isinstance(vci, int):
            if vci > total and cfg.check_val_every_n_epoch is not None and cfg.limit_val_batches > 0 \
                    and total != 0:
                raise TrainerConfigError(
                    f" `val_check_interval` ({vci}) must be less than or equal to the number of the training batches "
                    f"({total}). If you want to disable validation set `limit_val_batches` to 0.0 instead. If you "
                    "want to validate based on the total training batches, set `check_val_every_n_epoch=None`.")
            return vci
        if total == math.inf:
            if vci != 1.0:
                raise TrainerConfigError(
                    "When using an IterableDataset for `train_dataloader`, `Trainer(val_check_interval)` must be "
                    "time based, `1.0` or an int. An int k specifies checking validation every k training batches.")
            return math.inf
        return max(1, int(total * vci))
