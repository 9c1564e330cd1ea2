"""What callbacks, modules and users read off a ``Trainer``: Lightning's public properties and ``trainer.state``.

``TrainerProperties`` is a mixin of ``Trainer``: the settings it was given (``limit_*_batches``,
``num_sanity_val_steps``...), what a run found (``num_training_batches``, ``val_dataloaders``...),
the state machine (``state``, ``training``, ``sanity_checking``, ``interrupted``...) and
``_call_and_handle_interrupt``, which runs ``fit`` / ``validate`` / ``test`` / ``predict`` as Lightning
does when they fail: Ctrl-C ends the process after a graceful shutdown, other errors propagate.
"""

from __future__ import annotations

import math
import os
import signal
import sys
from typing import Any, Callable

from gpulayer.trainer.callbacks import Callback, EarlyStopping, ModelCheckpoint, ProgressBar, TQDMProgressBar
from gpulayer.trainer.states import RunningStage, TrainerFn, TrainerState, TrainerStatus
from gpulayer.trainer.utilities.combined_loader import CombinedLoader
from gpulayer.trainer.utilities.rank_zero import rank_zero_info, rank_zero_warn
from gpulayer.trainer.utilities.warnings import PossibleUserWarning


def _stage_flag(stage: RunningStage) -> property:
    """Lightning's ``trainer.training = True`` style: setting enters the stage, clearing leaves it."""

    def get(self) -> bool:
        return self.state.stage == stage

    def set_(self, value: bool) -> None:
        if value:
            self.state.stage = stage
        elif self.state.stage == stage:
            self.state.stage = None

    return property(get, set_)


class TrainerProperties:
    """Mixed into ``Trainer``; reads ``self.config`` and the run's attributes."""

    state: TrainerState
    predict_loop: Any = None  # the last predict run's outputs and batch indices (predict_state.py)
    _fit_started = False  # a fit began on this Trainer (max_epochs is resolved from then on)

    # -- settings -------------------------------------------------------------------------------
    callbacks = property(lambda self: self.config.callbacks)

    @property
    def default_root_dir(self) -> str:
        """Where logs and checkpoints go; ``~`` expanded for a local path, as Lightning shows it."""
        path = self.config.default_root_dir
        return path if "://" in path else os.path.normpath(os.path.expanduser(path))

    @property
    def max_epochs(self) -> int | None:
        # not given: None until a fit resolves it (1000, or -1 when max_steps bounds the run), as Lightning shows
        cfg = self.config
        return cfg.max_epochs if cfg.max_epochs_given or self._fit_started else None

    min_epochs = property(lambda self: self.config.min_epochs)
    max_steps = property(lambda self: self.config.max_steps)
    min_steps = property(lambda self: self.config.min_steps)
    val_check_interval = property(lambda self: self.config.val_check_interval)
    check_val_every_n_epoch = property(lambda self: self.config.check_val_every_n_epoch)
    log_every_n_steps = property(lambda self: self.config.log_every_n_steps)
    @property
    def accumulate_grad_batches(self) -> int:
        return self.config.accumulate_grad_batches

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        # a callback may change it between epochs (GradientAccumulationScheduler); the fit loop reads it per epoch
        self.config.accumulate_grad_batches = value
    gradient_clip_val = property(lambda self: self.config.gradient_clip_val)
    gradient_clip_algorithm = property(lambda self: self.config.gradient_clip_algorithm)
    precision = property(lambda self: self.config.precision)
    num_nodes = property(lambda self: self.config.num_nodes)
    num_devices = property(lambda self: self.config.devices)
    fast_dev_run = property(lambda self: True if self.config.fast_dev_run == 1 else self.config.fast_dev_run)
    limit_train_batches = property(lambda self: self.config.limit_train_batches)
    limit_val_batches = property(lambda self: self.config.limit_val_batches)
    limit_test_batches = property(lambda self: self.config.limit_test_batches)
    limit_predict_batches = property(lambda self: self.config.limit_predict_batches)
    overfit_batches = property(lambda self: self.config.overfit_batches)
    reload_dataloaders_every_n_epochs = property(lambda self: self.config.reload_dataloaders_every_n_epochs)
    profiler = property(lambda self: self.config.profiler)
    barebones = property(lambda self: self.config.barebones)
    _detect_anomaly = property(lambda self: self.config.detect_anomaly)

    @property
    def num_sanity_val_steps(self) -> int | float:
        """Batches per val loader in the sanity check; ``-1`` given means all (``inf``), as Lightning reports it."""
        n = self.config.num_sanity_val_steps
        return math.inf if n == -1 else n

    # -- where this process stands ----------------------------------------------------------------
    @property
    def lightning_module(self) -> Any:
        """The module of the current (or last) run: the one the strategy holds, as in Lightning."""
        return self.strategy.lightning_module if self.strategy is not None else None

    @lightning_module.setter
    def lightning_module(self, module: Any) -> None:
        self.strategy.lightning_module = module

    model = property(lambda self: self.lightning_module)
    global_rank = property(lambda self: self.strategy.global_rank if self.strategy else 0)
    local_rank = property(lambda self: self.strategy.local_rank if self.strategy else 0)
    node_rank = property(lambda self: self.global_rank // max(self.config.devices, 1))
    is_global_zero = property(lambda self: self.strategy.is_global_zero if self.strategy else True)

    @property
    def world_size(self) -> int:
        # before and after a multi-process fit this process holds no strategy; Lightning knows the world from
        # the arguments (its launching process is rank 0 of it)
        return self.strategy.world_size if self.strategy else self.config.devices * self.config.num_nodes

    @property
    def accelerator(self) -> Any:
        """The ``Accelerator`` that ``accelerator=`` resolved to (``gpulayer.trainer.accelerators``)."""
        return self.config.accelerator_object

    @property
    def device_ids(self) -> list[int]:
        return list(self.config.device_ids) if self.config.device_ids else list(range(self.config.devices))

    # -- callbacks and loggers ----------------------------------------------------------------------
    @property
    def logger(self) -> Any:
        """The first logger (None without any), as Lightning's; setting it replaces them all."""
        return self.config.loggers[0] if self.config.loggers else None

    @logger.setter
    def logger(self, logger: Any) -> None:
        self.config.loggers = [] if logger is None else [logger]

    @property
    def loggers(self) -> list:
        return self.config.loggers

    @loggers.setter
    def loggers(self, loggers: list | None) -> None:
        self.config.loggers = list(loggers or [])

    checkpoint_callbacks = property(lambda self: [c for c in self.callbacks if isinstance(c, ModelCheckpoint)])
    checkpoint_callback = property(lambda self: next(iter(self.checkpoint_callbacks), None))
    early_stopping_callbacks = property(lambda self: [c for c in self.callbacks if isinstance(c, EarlyStopping)])
    early_stopping_callback = property(lambda self: next(iter(self.early_stopping_callbacks), None))

    @property
    def progress_bar_callback(self) -> Callback | None:
        return next((c for c in self.callbacks if isinstance(c, (ProgressBar, TQDMProgressBar))), None)

    @property
    def log_dir(self) -> str | None:
        """Lightning's rule: the first logger's ``log_dir`` for TensorBoard and CSV (``save_dir/name/version_N``), its
        ``save_dir`` for any other (a hosted service's local directory); ``default_root_dir`` without a logger."""
        from gpulayer.trainer.loggers import CSVLogger, DummyLogger, TensorBoardLogger
        logger = self.logger
        if logger is None or isinstance(logger, DummyLogger):
            return self.default_root_dir
        return logger.log_dir if isinstance(logger, (TensorBoardLogger, CSVLogger)) else logger.save_dir

    @property
    def callback_metrics(self) -> dict[str, Any]:
        """What callbacks monitor: the latest step values and epoch values as tensors, like Lightning's.

        A plain dict that callbacks may add to (``LearningRateMonitor`` puts its ``lr-*`` values here).
        """
        return self.metric_store.callback_metrics()

    @property
    def logged_metrics(self) -> dict[str, Any]:
        """The values sent to the logger (tensors, Lightning's names: ``x_step``, ``x_epoch/dataloader_idx_0``)."""
        return self.metric_store.logged_metrics()

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """The ``prog_bar=True`` values, as floats."""
        return self.metric_store.progress_bar_metrics()

    @property
    def is_log_step(self) -> bool:
        return self.global_step % self.config.log_every_n_steps == 0

    # -- the state machine --------------------------------------------------------------------------
    training = _stage_flag(RunningStage.TRAINING)
    validating = _stage_flag(RunningStage.VALIDATING)
    testing = _stage_flag(RunningStage.TESTING)
    predicting = _stage_flag(RunningStage.PREDICTING)
    sanity_checking = _stage_flag(RunningStage.SANITY_CHECKING)

    @property
    def evaluating(self) -> bool:
        return self.state.stage is not None and self.state.stage.evaluating

    @property
    def interrupted(self) -> bool:
        return self.state.status == TrainerStatus.INTERRUPTED

    @property
    def received_sigterm(self) -> bool:
        """Lightning's flag: a SIGTERM came during the fit. Only a cluster fit's ranks (``fit_rank``) listen for
        it (a preemption's): rank 0 saves a checkpoint at the end of the batch and the fit stops; elsewhere
        gpulayer installs no handler and a SIGTERM ends the process as usual."""
        return getattr(self, "_received_sigterm", False)

    @property
    def state_stage(self) -> str | None:
        """The running entry point's name (``"fit"``...), or None between runs."""
        return self.state.fn.value if self.state.fn is not None and self.state.status == TrainerStatus.RUNNING \
            else None

    @state_stage.setter
    def state_stage(self, value: str | None) -> None:
        if value is not None:
            self.state.fn = TrainerFn(value)

    # -- what a run found ---------------------------------------------------------------------------
    @property
    def train_dataloader(self) -> Any:
        """The train loader(s) of the fit as given (a CombinedLoader's iterables), after distribution."""
        loader = self.loaders.train
        return loader.iterables if isinstance(loader, CombinedLoader) else loader

    val_dataloaders = property(lambda self: self.loaders.stages.get("validate"))
    test_dataloaders = property(lambda self: self.loaders.stages.get("test"))
    predict_dataloaders = property(lambda self: self.loaders.stages.get("predict"))

    @property
    def num_sanity_val_batches(self) -> list[int | float]:
        """The sanity check's batches per val loader: a fit's (``[]`` before a fit requested its val loaders)."""
        return [min(self.num_sanity_val_steps, n) for n in self.loaders.fit_val_batches]

    @property
    def enable_validation(self) -> bool:
        """Validation runs in this fit: val loaders exist, the module defines validation_step, limit_val_batches > 0."""
        return bool(self.has_val_loader) and self.config.limit_val_batches > 0

    @property
    def is_last_batch(self) -> bool:
        """The batch being trained on is the epoch's last (from its ``on_train_batch_start`` until the next epoch's
        first batch); a loader without a length has no known last batch until it ends."""
        loop = self.loop
        return loop is not None and (loop.batch_idx + 1 >= loop.num_train_batches or loop.epoch_done)

    @property
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps the fit will take (for schedulers such as OneCycleLR), as Lightning estimates them."""
        cfg = self.config
        if cfg.max_epochs == -1:
            return math.inf if cfg.max_steps == -1 else cfg.max_steps
        total = self.num_training_batches
        if not total and self.loaders.train is None and self.lightning_module is not None:
            total = self._estimate_train_batches()
        if total == math.inf:
            return cfg.max_steps
        steps = math.ceil(total / cfg.accumulate_grad_batches) * max(cfg.max_epochs, 1)
        return min(steps, cfg.max_steps) if cfg.max_steps != -1 else steps

    def _estimate_train_batches(self) -> int | float:
        """Ask the fit's train loader source for its length (``configure_optimizers`` may run before loading)."""
        from gpulayer.trainer import data
        source = self.loaders.train_source
        if source is None:
            return 0
        loader = data.combine_train(source())
        return data.num_batches(loader, self.config.limit_train_batches)

    # -- running an entry point ---------------------------------------------------------------------
    def _begin(self, fn: TrainerFn, stage: RunningStage) -> None:
        cfg = self.config
        if fn == TrainerFn.FITTING and not cfg.max_epochs_given and cfg.max_steps == -1 and not cfg.fast_dev_run:
            rank_zero_warn("`max_epochs` was not set. Setting it to 1000 epochs. To train without an epoch limit, set "
                           "`max_epochs=-1`.", category=PossibleUserWarning)
        self._fit_started = self._fit_started or fn == TrainerFn.FITTING
        self.state.fn, self.state.status, self.state.stage = fn, TrainerStatus.RUNNING, stage

    def _call_and_handle_interrupt(self, body: Callable[..., Any], *args: Any) -> Any:
        """Run ``body``; on an error, Lightning's shutdown: ``on_exception`` hooks, loggers finalized "failed".

        A ``KeyboardInterrupt`` (Ctrl-C) then ends the process with exit code 1, as Lightning 2.x does
        (``SystemExit(1)``, so ``finally`` blocks and atexit handlers still run); any other error propagates.
        """
        try:
            out = body(*args)
        except KeyboardInterrupt as err:
            rank_zero_info("\nDetected KeyboardInterrupt, attempting graceful shutdown ...")
            previous = signal.getsignal(signal.SIGINT)
            try:  # a second Ctrl-C must not cut the shutdown short
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            except ValueError:  # not the main thread: signals cannot be changed here
                previous = None
            try:
                self._on_exception(err)
            finally:
                if previous is not None:
                    signal.signal(signal.SIGINT, previous)
            sys.exit(1)
        except BaseException as err:
            self._on_exception(err)
            self.state.stage = None
            raise
        if self.state.status == TrainerStatus.RUNNING:
            self.state.status = TrainerStatus.FINISHED
        self.state.stage = None
        return out

    def _on_exception(self, err: BaseException) -> None:
        """Lightning's handling of a failed run, once per error: status INTERRUPTED, the callbacks' and the
        datamodule's ``on_exception``, loggers finalized as "failed"."""
        if getattr(self, "_handled_error", None) is err:
            return
        self._handled_error = err
        self.state.status = TrainerStatus.INTERRUPTED
        for cb in self.callbacks:
            if type(cb).on_exception is not Callback.on_exception or "on_exception" in vars(cb):  # LambdaCallback
                cb.on_exception(self, self.lightning_module, err)
        if self.datamodule is not None and callable(getattr(self.datamodule, "on_exception", None)):
            self.datamodule.on_exception(err)
        if self.strategy is not None:
            self.strategy.on_exception(err)
        for logger in self.loggers:
            if self.is_global_zero:
                logger.finalize("failed")
