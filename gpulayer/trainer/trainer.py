"""``Trainer``: Lightning's arguments and ``fit``, a faster loop underneath.

``fit`` runs in this process (one device), starts ``devices`` processes on this
machine (``launcher.py``), or, with ``num_nodes > 1``, submits one distributed
job of ``num_nodes x devices`` ranks to the cluster (``cluster.py``). Each rank
runs ``fit_rank`` and rank 0 hands its weights and metrics back. ``fit_rank``
works in any process whose torchrun environment is set.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import sys
import warnings
from typing import Any

import torch

from gpulayer.trainer import checkpoint, data, evaluate, gcfreeze, optimizers, stage_aids
from gpulayer.trainer import trainer_logging
from gpulayer.trainer import loggers as loggers_mod
from gpulayer.trainer.utilities import parsing
from gpulayer.trainer.callbacks import Callback
from gpulayer.trainer.config import TrainerConfig, build_config
from gpulayer.trainer.datamodule import LightningDataModule
from gpulayer.trainer.core.optimizer import LightningOptimizer
from gpulayer.trainer.errors import SIGTERMException, TrainerConfigError, TrainerError, TrainerTypeError
from gpulayer.trainer.fit_data import FitData, Loaders
from gpulayer.trainer.hooks import Hooks
from gpulayer.trainer.loop import FitLoop
from gpulayer.trainer import metrics as metrics_mod
from gpulayer.trainer.metrics import MetricStore
from gpulayer.trainer.module import Module
from gpulayer.trainer.plugins.precision import Precision
from gpulayer.trainer.states import RunningStage, TrainerFn, TrainerState
from gpulayer.trainer.strategies import DDPStrategy, SingleDeviceStrategy, strategy_for
from gpulayer.trainer.strategies.selection import adopt_strategy
from gpulayer.trainer.trainer_state import TrainerProperties
from gpulayer.trainer.utilities.model_helpers import is_overridden

_UNSET: Any = object()


def _in_matching_job(cfg: TrainerConfig) -> bool:
    """True inside a launched rank (torchrun, gpulayer) whose world matches devices x num_nodes."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) == cfg.devices * cfg.num_nodes


class Trainer(TrainerProperties):
    """Train a ``Module``: ``Trainer(max_epochs=2, precision="bf16-mixed").fit(model, train_loader)``.

    Arguments have Lightning's names and meanings: ``max_epochs``, ``max_steps``,
    ``max_time``, ``limit_train_batches``, ``limit_val_batches``, ``precision``
    (``"32-true"``, ``"16-mixed"``, ``"bf16-mixed"``), ``accelerator``
    (``"auto"``, ``"cpu"``, ``"cuda"``, ``"gpu"``), ``devices``, ``num_nodes``,
    ``strategy``, ``benchmark`` (cuDNN autotuning, on by default),
    ``deterministic``, ``gradient_clip_val``, ``gradient_clip_algorithm``,
    ``accumulate_grad_batches``, ``check_val_every_n_epoch``,
    ``val_check_interval``, ``log_every_n_steps``, ``num_sanity_val_steps``,
    ``callbacks``, ``logger``, ``enable_checkpointing``, ``enable_progress_bar``
    (a ``TQDMProgressBar`` callback, on by default), ``default_root_dir``,
    ``fast_dev_run``, ``profiler`` (``"simple"``, ``"advanced"``, ``"pytorch"``: ``profilers/``),
    ``barebones`` (``barebones.py``), ``detect_anomaly``. gpulayer adds ``prefetch`` (copy the next batch to the GPU
    during the current step), ``grad_sync`` (``"auto"``, ``"two_level"``,
    ``"flat"``: see ``gradsync.py``), ``cluster_resources`` (a
    ``gpulayer.Resources`` the workers of a ``num_nodes > 1`` fit must offer)
    and ``max_restarts`` (a ``num_nodes > 1`` fit restarts on live workers
    after a rank or a worker fails, from its newest checkpoint: ``cluster.py``).

    ``Trainer(num_nodes=2, devices=4).fit(model)`` runs on the cluster this
    process is connected to (``gpulayer.init``): each rank builds its data from
    ``model.train_dataloader()``, a loader factory (``fit(model, make_loader)``)
    or a datamodule, so datasets never travel; ``fit_info`` says how it ran.

    Besides Lightning's attributes, a Trainer shows the state its loop, evaluation, checkpoints and callbacks
    share (read them; the Trainer and its loop set them): ``config`` (the validated arguments, ``config.py``),
    ``precision_plugin`` (Lightning's name; ``plugins/precision/``), ``hooks`` (the running stage's hook lists,
    ``hooks.py``), ``metric_store`` (what ``self.log`` recorded, ``metrics.py``), ``loop`` (the running or last
    fit's ``loop.FitLoop``: its position and validation schedule), ``loaders`` (``fit_data.Loaders``: the loaders
    the runs used), ``batches_stepped`` (the logger's step), ``val_has_run``, ``lightning_optimizers`` and
    ``fit_id`` (a cluster fit's id).
    """

    def __init__(self, **kwargs: Any) -> None:
        self.config = build_config(**kwargs)
        self._init_state()
        given = kwargs.get("strategy")
        if type(given) is not SingleDeviceStrategy and isinstance(given, SingleDeviceStrategy) and \
                not isinstance(given, DDPStrategy) and not self.config.multi_process:
            # a user's own single-device strategy (a subclass) runs in this process: its overrides are promises
            self.strategy = adopt_strategy(given, self.config)
            self.strategy._trainer = self

    @classmethod
    def from_config(cls, config: TrainerConfig) -> "Trainer":
        """A Trainer for an already-validated config (what ``fit_rank`` uses inside each rank)."""
        trainer = cls.__new__(cls)
        trainer.config = config
        trainer._init_state()
        return trainer

    def _init_state(self) -> None:
        self.global_step = 0
        self.current_epoch = 0
        self.should_stop = False
        self.state = TrainerState()
        self.optimizers: list[torch.optim.Optimizer] = []
        self.datamodule: Any = None
        self.lightning_optimizers: list[LightningOptimizer] = []  # what ``module.optimizers()`` returns
        self.batches_stepped = 0  # Lightning's _batches_that_stepped: the logger's step
        self.val_has_run = False  # a (non-sanity) validation ran in a fit (ModelCheckpoint's missing-monitor rule)
        self.num_val_batches: list[float] = []
        self.num_test_batches: list[float] = []
        self.num_predict_batches: list[float] = []
        self.loaders = Loaders()  # the loaders the runs used (fit_data.py)
        self.val_check_batch: float = math.inf  # validate every this many train batches (set when a fit loads data)
        self.ckpt_path: str | None = None
        self.lr_scheduler_configs: list[optimizers.SchedulerConfig] = []
        # Lightning's trainer holds its strategy from the start (``trainer.strategy.connect(model)``) and runs
        # every stage on it (a launched rank makes its own); the module of the run lives on it
        self.strategy: SingleDeviceStrategy = strategy_for(self.config)
        self.strategy._trainer = self
        self.has_val_loader = False
        self.num_training_batches: float = 0
        # set up per run (_in_process, _setup_stage, _run): what the loops, checkpoints and callbacks read
        self.hooks: Hooks | None = None
        self.loop: FitLoop | None = None  # the running (or last) fit's loop: position, loaders, validation schedule
        self.metric_store = MetricStore()
        self.fit_info: dict[str, Any] = {}  # strategy, world, grad sync (and job, placement on the cluster)
        # A cluster fit: its id, written into its checkpoints; on a restarted attempt, resume from its newest one.
        self.fit_id: str | None = None
        self._resume_newest = False
        self._resumed_from: dict[str, Any] | None = None
        self._received_sigterm = False  # a cluster fit's rank was sent SIGTERM (a preemption): see _on_sigterm

    @property
    def precision_plugin(self) -> Precision:
        """The precision plugin every stage runs with (``plugins/precision``): the strategy's."""
        return self.strategy.precision_plugin

    # -- fit ------------------------------------------------------------------------------------
    def fit(self, model: Module, train_dataloaders: Any = None, val_dataloaders: Any = None, datamodule: Any = None,
            ckpt_path: str | None = None, weights_only: bool | None = None) -> None:
        """Train ``model``; loaders may also come from ``model.train_dataloader()`` or a ``datamodule``.

        ``ckpt_path`` resumes from a checkpoint (a path, ``"last"`` or ``"best"``),
        restoring weights, optimizers, schedulers, the loss scaler, loop position
        and random states so the run continues as if never interrupted. ``weights_only`` is taken for
        Lightning's signature; a checkpoint the Trainer resumes from is read in full (it holds the loops' state).
        """
        self._begin(TrainerFn.FITTING, RunningStage.TRAINING)
        self.should_stop = False
        self._call_and_handle_interrupt(self._fit_impl, model, train_dataloaders, val_dataloaders, datamodule,
                                        ckpt_path)

    def _fit_impl(self, model: Module, train_dataloaders: Any, val_dataloaders: Any, datamodule: Any,
                  ckpt_path: str | None) -> None:
        if not isinstance(model, Module):
            raise TrainerTypeError(
                f"`model` must be a `LightningModule` or `torch._dynamo.OptimizedModule`, got `{type(model).__qualname__}`"
                " (subclass gpulayer.trainer.LightningModule)")
        if isinstance(train_dataloaders, LightningDataModule):  # trainer.fit(model, dm), as Lightning accepts
            datamodule, train_dataloaders = train_dataloaders, None
        if datamodule is not None and (train_dataloaders is not None or val_dataloaders is not None):
            raise TrainerConfigError(
                "You cannot pass `train_dataloader` or `val_dataloaders` to `trainer.fit(datamodule=...)`")
        cfg = self.config
        if cfg.multi_process and not _in_matching_job(cfg):
            from gpulayer.trainer import cluster, launcher
            run = cluster.fit_on_cluster if cfg.num_nodes > 1 else launcher.fit_in_processes
            # the ranks start where this trainer stands (a second fit after max_epochs has nothing left to do)
            with loggers_mod.across_ranks(self):
                result = run(functools.partial(fit_rank, position=self._position()), cfg, model, train_dataloaders,
                             val_dataloaders, datamodule, ckpt_path)
            self._take_result(model, result)
            self.training = False
            return
        self._fit_here(model, train_dataloaders, val_dataloaders, datamodule, ckpt_path)

    # -- validate, test, predict ----------------------------------------------------------------
    def validate(self, model: Module | None = None, dataloaders: Any = None, ckpt_path: str | None = None,
                 verbose: bool = True, datamodule: Any = None, weights_only: bool | None = None) -> list[dict[str, float]]:
        """One validation pass; returns a dict of the logged epoch metrics per loader (Lightning's value)."""
        return self._evaluate("validate", model, dataloaders, datamodule, ckpt_path, verbose=verbose)

    def test(self, model: Module | None = None, dataloaders: Any = None, ckpt_path: str | None = None,
             verbose: bool = True, datamodule: Any = None, weights_only: bool | None = None) -> list[dict[str, float]]:
        """One pass of ``test_step`` over the test loaders; returns the logged metrics per loader.

        >>> trainer.fit(model, train_loader); trainer.test(model, test_loader)   # doctest: +SKIP
        [{'test_loss': 0.12}]
        """
        return self._evaluate("test", model, dataloaders, datamodule, ckpt_path, verbose=verbose)

    def predict(self, model: Module | None = None, dataloaders: Any = None, datamodule: Any = None,
                return_predictions: bool | None = None, ckpt_path: str | None = None,
                weights_only: bool | None = None) -> list | None:
        """``predict_step`` (default ``self(batch)``) over the predict loaders; one output per batch.

        With several loaders, a list per loader. On ``devices > 1`` each rank predicts
        its share (every sample exactly once) and, as in Lightning, rank 0's are returned.
        """
        return self._evaluate("predict", model, dataloaders, datamodule, ckpt_path,
                              return_predictions=True if return_predictions is None else return_predictions)

    def _evaluate(self, stage: str, model: Module | None, dataloaders: Any, datamodule: Any, ckpt_path: str | None,
                  **kw: Any) -> Any:
        self._begin(TrainerFn(stage), RunningStage(stage))
        return self._call_and_handle_interrupt(self._evaluate_impl, stage, model, dataloaders, datamodule, ckpt_path,
                                               kw)

    def _evaluate_impl(self, stage: str, model: Module | None, dataloaders: Any, datamodule: Any,
                       ckpt_path: str | None, kw: dict[str, Any]) -> Any:
        model_provided = model is not None
        if model is None:
            model = self.lightning_module
            if model is None:
                raise TrainerTypeError(
                    f"`Trainer.{stage}()` requires a `LightningModule` when it hasn't been passed in a previous run; "
                    f"call trainer.{stage}(model, dataloaders)")
        if not isinstance(model, Module):
            raise TrainerTypeError(f"`model` must be a `LightningModule` or `torch._dynamo.OptimizedModule`, got "
                                   f"`{type(model).__qualname__}` (subclass gpulayer.trainer.LightningModule)")
        if isinstance(dataloaders, LightningDataModule):  # trainer.test(model, dm)
            datamodule, dataloaders = dataloaders, None
        if dataloaders is not None and datamodule is not None:
            raise TrainerConfigError(
                f"You cannot pass both `trainer.{stage}(dataloaders=..., datamodule=...)`, choose one to pass.")
        evaluate.check_step(stage, model)
        ckpt = self._eval_checkpoint(stage, ckpt_path, model_provided)
        cfg = self.config
        if cfg.multi_process and not _in_matching_job(cfg):
            if cfg.num_nodes > 1:
                raise TrainerError(
                    f"Trainer(num_nodes={cfg.num_nodes}).{stage}() is not supported yet: gpulayer runs validate/test/"
                    "predict on one machine; use Trainer(devices=M) (or devices=1) for this stage")
            from gpulayer.trainer import launcher
            with loggers_mod.across_ranks(self):
                result = launcher.stage_in_processes(functools.partial(stage_rank, position=self._position()), cfg,
                                                     stage, model, dataloaders, datamodule, ckpt, kw)
            loggers_mod.adopt(self, result.get("loggers"))
            model.trainer = self
            self.lightning_module = model
            self.metric_store.load_result(result["callback_metrics"], result["logged_metrics"])
            for cb, state in zip(self.callbacks, result["callbacks"]):
                cb.load_state_dict(state)
            return result["output"]
        return self._in_process(model, self._run_eval, stage, model, dataloaders, datamodule, ckpt, kw)

    def _eval_checkpoint(self, stage: str, ckpt_path: str | None, model_provided: bool) -> str | None:
        """Lightning's choice of weights: the model as passed, else the best (or last) checkpoint of the fit."""
        fn = stage
        if ckpt_path is None and (model_provided or self.lightning_module is None):
            return None
        if ckpt_path is None:
            if self.checkpoint_callback is None or not self.checkpoint_callback.best_model_path:
                return None  # nothing saved: the weights the fit left in the model
            ckpt_path = "best"
            warnings.warn(f"`.{fn}(ckpt_path=None)` was called without a model. The best model of the previous `fit` "
                          f"call will be used. You can pass `.{fn}(ckpt_path='best')` to use the best model or "
                          f"`.{fn}(ckpt_path='last')` to use the last model. If you pass a value, this warning will "
                          "be silenced.", stacklevel=4)
        if ckpt_path == "best":
            if not self.checkpoint_callback:
                raise ValueError(f'`.{fn}(ckpt_path="best")` is set but `ModelCheckpoint` is not configured.')
            if not self.checkpoint_callback.best_model_path:
                raise ValueError(f'`.{fn}(ckpt_path="best")` is set but `ModelCheckpoint` is not configured to save '
                                 "the best model (run fit first, or pass a checkpoint file).")
            return self.checkpoint_callback.best_model_path
        if ckpt_path == "last":
            found = [p for p in self._last_candidates() if os.path.exists(p)]  # a file, or a sharded directory
            if not found:
                warnings.warn(f'.{fn}(ckpt_path="last") is set, but there is no last checkpoint available. No checkpoint '
                              "will be loaded. HINT: Set `ModelCheckpoint(..., save_last=True)`.", stacklevel=4)
                return None
            return max(found, key=os.path.getmtime)
        return os.fspath(ckpt_path)

    def _last_candidates(self) -> list[str]:
        cbs = self.checkpoint_callbacks
        return [c.last_model_path for c in cbs if c.last_model_path] + \
            [os.path.join(c.dirpath, "last.ckpt") for c in cbs if c.dirpath]

    def _run_eval(self, stage: str, module: Module, dataloaders: Any, datamodule: Any, ckpt_path: str | None,
                  kw: dict[str, Any]) -> Any:
        """Lightning's order: setup, configure_model, weights (checkpoint), zero_grad, then the loaders and the loop."""
        self.state_stage = stage
        hooks = self._setup_stage(stage, module, datamodule)
        _, _, _, limit_name = evaluate.STAGES[stage]
        self.strategy.setup_eval_module(module)
        if ckpt_path is not None:
            ckpt = self.strategy.load_checkpoint(ckpt_path, weights_only=kw.pop("weights_only", None))
            module.load_state_dict(ckpt["state_dict"])
            hooks.call("on_load_checkpoint", ckpt)
        self.ckpt_path = ckpt_path
        module.zero_grad()
        method, loaders = f"{'val' if stage == 'validate' else stage}_dataloader", []
        if stage == "predict" or getattr(self.config, limit_name) != 0:  # a limit of 0: no loader, no loop
            if dataloaders is not None:
                loaders = data.resolve(dataloaders)
            else:
                with stage_aids.profile_hook(self, datamodule if datamodule is not None else module, method):
                    loaders = data.from_datamodule(datamodule, method) if datamodule is not None \
                        else getattr(module, method)()
            if loaders is None:
                raise TrainerConfigError(
                    f"No `{method}()` method defined to run `Trainer.{stage}`; pass dataloaders=... or define "
                    f"{method}() on the module or the datamodule")
            mode = "predict" if stage == "predict" else "eval"
            given, loaders = loaders, [data.distribute(self, dl, mode) for dl in data.as_list(loaders)]
            for dl in loaders:
                data.check_lengths(dl, self)
            self.loaders.stages[stage] = data.as_given(given, loaders)
        loggers_mod.log_hyperparams(self)
        setattr(self, f"num_{method[:-11]}_batches",
                data.stage_counts(loaders, getattr(self.config, limit_name), method[:-11]))
        try:
            out = evaluate.EvalLoop(self, module, stage, loaders, **kw).run() if loaders else []
        finally:
            self.state_stage = None
        self._teardown_stage(stage)
        loggers_mod.finalize(self)  # after teardown, as Lightning: what the run's last hooks logged is flushed too
        return out

    def _fit_here(self, module: Module, train_dataloaders: Any, val_dataloaders: Any, datamodule: Any,
                  ckpt_path: str | None) -> None:
        self._in_process(module, self._run, module, train_dataloaders, val_dataloaders, datamodule, ckpt_path)

    def _in_process(self, module: Module, body: Any, *args: Any) -> Any:
        """Set up this process's strategy, precision and metric store around ``body(*args)`` (any stage)."""
        cfg = self.config
        if cfg.multi_process:  # a launched rank: its own rank, world and device (the one built at init planned them)
            self.strategy = strategy_for(cfg)
        device = self.strategy.root_device
        self.strategy._trainer = self
        self.strategy.setup_environment()
        self._setup_backends()
        self.metric_store = MetricStore(self.strategy.reduce if self.strategy.world_size > 1 else None)
        self.lightning_module = module
        module.trainer = self
        module._metric_store = self.metric_store
        self.fit_info = self.strategy.describe()
        try:
            with stage_aids.around_stage(self, self.state.fn.value if self.state.fn is not None else "fit"):
                out = body(*args)
            # every rank is done with its collectives before any destroys the group: a rank whose
            # peer tore gloo down under it can abort at exit ("terminate called without an active exception")
            self.strategy.barrier()
            return out
        finally:
            self.fit_info = self.strategy.describe()  # now with the comm hook DDP got
            module._metric_store = None
            self.metric_store.teardown()  # the metrics stay readable on the CPU, as Lightning leaves them
            self.strategy.teardown()

    def _setup_backends(self) -> None:
        cfg = self.config
        torch.backends.cudnn.benchmark = cfg.benchmark
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=cfg.deterministic == "warn")
            torch.backends.cudnn.deterministic = True
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    def _setup_stage(self, stage: str, module: Module, datamodule: Any) -> Hooks:
        """Lightning's start of every stage: configure_callbacks, prepare_data, setup, configure_model."""
        cfg = self.config
        hparams = getattr(module, "_hparams", None)  # as Lightning's every run: what cannot be pickled goes
        if hparams:
            parsing.clean_namespace(hparams)
        extra = module.configure_callbacks() or []
        cfg.callbacks = cfg.callbacks + [c for c in (extra if isinstance(extra, (list, tuple)) else [extra])
                                         if isinstance(c, Callback) and c not in cfg.callbacks]
        self.hooks = hooks = Hooks(self, module, cfg.callbacks, datamodule)
        metrics_mod.attach_callback_logging(cfg.callbacks, module)
        self.datamodule = datamodule
        if datamodule is not None:
            datamodule.trainer = self
            if self.local_rank == 0 and is_overridden("prepare_data", datamodule, LightningDataModule):
                with stage_aids.profile_hook(self, datamodule, "prepare_data"):
                    datamodule.prepare_data()
        if self.local_rank == 0 and is_overridden("prepare_data", module, Module):
            module.prepare_data()
        # as Lightning: each logger's experiment exists before the first setup hook; W&B's first, since wandb.init
        # must run before any TensorBoard writer is created for wandb to sync TensorBoard's files
        for logger in sorted(self.loggers, key=lambda lg: not isinstance(lg, loggers_mod.WandbLogger)):
            getattr(logger, "experiment", None)
        self.strategy.barrier()
        if datamodule is not None and hasattr(datamodule, "setup"):
            with stage_aids.profile_hook(self, datamodule, "setup"):
                datamodule.setup(stage=stage)
        hooks.call("setup", stage=stage)
        older = is_overridden("configure_sharded_model", module, Module)
        if older and is_overridden("configure_model", module, Module):
            name = type(module).__name__
            raise RuntimeError(f"Both `{name}.configure_model`, and `{name}.configure_sharded_model` are overridden. "
                               "The latter is deprecated and it should be replaced with the former.")
        if older:
            warnings.warn(f"You have overridden `{type(module).__name__}.configure_sharded_model` which is deprecated. "
                          "Please override the `configure_model` hook instead. Instantiation with the newer hook will "
                          "be created on the device right away and have the right data type depending on the "
                          "precision setting in the Trainer.", DeprecationWarning, stacklevel=2)
        for name in ("configure_sharded_model", "configure_model"):  # Lightning's older name first
            if is_overridden(name, module, Module):
                with self.precision_plugin.module_init_context():  # the layers it makes get the run's dtype
                    getattr(module, name)()
        return hooks

    def _teardown_stage(self, stage: str) -> None:
        if self.datamodule is not None and hasattr(self.datamodule, "teardown"):
            with stage_aids.profile_hook(self, self.datamodule, "teardown"):
                self.datamodule.teardown(stage=stage)
        self.hooks.call("teardown", stage=stage)

    def _run(self, module: Module, train: Any, val: Any, datamodule: Any, ckpt_path: str | None) -> None:
        """Lightning's fit order: setup and configure_model, the optimizers, on_fit_start, then the data and the loop."""
        cfg = self.config
        self.state_stage = "fit"
        if not module.automatic_optimization and cfg.gradient_clip_val:
            raise TrainerConfigError(
                "Automatic gradient clipping is not supported for manual optimization. Remove "
                f"`Trainer(gradient_clip_val={cfg.gradient_clip_val})` or switch to automatic optimization "
                "(call self.clip_gradients(opt, gradient_clip_val=...) in training_step instead).")
        if not module.automatic_optimization and cfg.accumulate_grad_batches != 1:
            raise TrainerConfigError(
                "Automatic gradient accumulation is not supported for manual optimization. Remove "
                f"`Trainer(accumulate_grad_batches={cfg.accumulate_grad_batches})` or switch to automatic optimization.")
        hooks = self._setup_stage("fit", module, datamodule)
        self.ckpt_path = ckpt_path
        # a resume, in Lightning's two phases: the module's and callbacks' states before configure_optimizers,
        # the optimizers', schedulers' and loops' after on_fit_start
        ckpt = self._resume_attempt() if self._resume_newest else None
        if ckpt is None and ckpt_path is not None:
            ckpt = self._resume_checkpoint(ckpt_path)
        if ckpt is not None:
            checkpoint.restore_modules_and_callbacks(self, ckpt)
        step_fn = self.strategy.setup_module(module)
        self.optimizers, self.lr_scheduler_configs = optimizers.parse(module.configure_optimizers(), module)
        self.lightning_optimizers = [LightningOptimizer._to_lightning_optimizer(o, self) for o in self.optimizers]
        self.loaders.fit_given = (train, val)
        hooks.call("on_fit_start")
        loggers_mod.log_hyperparams(self)  # also creates version_N now, as Lightning does
        resume = checkpoint.restore_training_state(self, ckpt) if ckpt is not None else None
        module.zero_grad()
        fit_data = FitData(self, module, train, val, datamodule)
        sanity = cfg.num_sanity_val_steps != 0 and ckpt_path is None and not self._resume_newest
        self.loop = FitLoop(self, module, step_fn, resume, sanity, fit_data)  # its run() requests the loaders
        with gcfreeze.frozen():  # a failure: the entry point's _call_and_handle_interrupt runs on_exception
            self.loop.run()
        hooks.call("on_fit_end")
        self._teardown_stage("fit")
        loggers_mod.finalize(self)  # after teardown, as Lightning: what on_fit_end logged is flushed too

    def _resume_attempt(self) -> dict[str, Any] | None:  # the checkpoint, loaded
        """A restarted attempt of a cluster fit: Lightning's ``ckpt_path="last"``, from this fit's newest checkpoint.

        Every rank reads the same file (the checkpoint directory must be shared storage on a real cluster);
        ``None`` when the fit had written none yet: it starts again from the beginning.
        """
        dirs = [c.dirpath for c in self.checkpoint_callbacks if c.dirpath]
        dirs += [d for d in [self._sigterm_dir()] if d not in dirs]  # where a preempted attempt saved
        found = checkpoint.newest_of_fit(dirs, self.fit_id)
        if found is None:
            return None
        path, ckpt = found
        if os.path.isdir(path):  # a sharded checkpoint: its weights are read here, into this world's shards
            ckpt = self.strategy.load_checkpoint(path)
        self.ckpt_path = path
        self._resumed_from = {"path": path, "global_step": ckpt["global_step"], "epoch": ckpt["epoch"]}
        return ckpt

    def _sigterm_dir(self) -> str:
        """Where a cluster fit's rank 0 saves on SIGTERM: the first checkpoint callback's directory, else
        ``<default_root_dir>/checkpoints``; a restarted attempt looks there too (``_resume_attempt``)."""
        dirs = [c.dirpath for c in self.checkpoint_callbacks if c.dirpath]
        return dirs[0] if dirs else os.path.join(self.default_root_dir, "checkpoints")

    def _on_sigterm(self) -> None:
        """A batch ended after SIGTERM (a preemption): rank 0 saves a full checkpoint and the fit stops.

        The other ranks carry on into the next batch's gradient all-reduce, which ends when rank 0 exits:
        had they stopped at their own batch end, rank 0 could be left waiting in a collective before it saved.
        The save is rank 0's alone (no barrier); written beside, then renamed, so a SIGKILL mid-write leaves
        the newest complete checkpoint the newest.
        """
        if not self.is_global_zero or hasattr(self.strategy, "sharding_plan"):
            return  # a sharded (FSDP) save is collective: the ranks are SIGKILLed after the grace instead
        folder = self._sigterm_dir()
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"preempted-step={self.global_step}.ckpt")
        self.strategy.save_checkpoint(checkpoint.dump(self), path + ".part")
        os.replace(path + ".part", path)
        print(f"Received SIGTERM: saved {path}; stopping the fit (a restart resumes from it)", file=sys.stderr,
              flush=True)
        raise SIGTERMException(143)

    def _resume_checkpoint(self, ckpt_path: str) -> dict[str, Any] | None:
        """The checkpoint to resume from, loaded: ``ckpt_path`` is a file, ``"last"``, ``"best"`` or ``"hpc"``;
        ``trainer.ckpt_path`` becomes the file."""
        path = checkpoint.hpc_resume_path(self.default_root_dir) if ckpt_path == "hpc" else ckpt_path
        if ckpt_path == "hpc" and path is None:
            raise ValueError('`.fit(ckpt_path="hpc")` is set but no HPC checkpoint was found. '
                             "Please pass an exact checkpoint path to `.fit(ckpt_path=...)`")
        if ckpt_path in ("last", "best"):
            path = self._eval_checkpoint("fit", ckpt_path, model_provided=True)
        self.ckpt_path = path
        return self.strategy.load_checkpoint(os.fspath(path)) if path is not None else None

    def _position(self) -> dict[str, int]:
        """The counters a stage in other processes starts from, as this trainer would (``_set_position`` there)."""
        return {"global_step": self.global_step, "current_epoch": self.current_epoch,
                "batches_stepped": self.batches_stepped}

    def _set_position(self, position: dict[str, int] | None) -> None:
        for name, value in (position or {}).items():
            setattr(self, name, value)

    def _take_result(self, module: Module, result: dict[str, Any]) -> None:
        """Rank 0's weights, counters, metrics and callback states, into this process's objects."""
        module.load_state_dict(result["state_dict"])
        self.lightning_module = module
        self.global_step, self.current_epoch = result["global_step"], result["current_epoch"]
        self.batches_stepped = result.get("batches_stepped", self.batches_stepped)
        self.should_stop = result.get("should_stop", False)
        self.fit_info = dict(result.get("fit_info", {}))
        self.metric_store.load_result(result["callback_metrics"], result["logged_metrics"])
        loggers_mod.adopt(self, result.get("loggers"))
        # by position: the ranks hold copies of these callbacks in the same order (class names of
        # by-value pickled classes may differ, so state_key is not reliable across processes)
        for cb, state in zip(self.callbacks, result["callbacks"]):
            if state:  # Lightning loads a callback's state only when it saved one
                cb.load_state_dict(state)

    def log_to_logger(self, metrics: dict[str, float], step: int | None = None) -> None:
        """For callbacks: send numbers straight to the logger (rank 0), at the current step by default."""
        trainer_logging.send_to_loggers(self, metrics, max(self.batches_stepped - 1, 0) if step is None else step)

    # -- checkpoints --------------------------------------------------------------------------------
    def save_checkpoint(self, filepath: str | os.PathLike, weights_only: bool = False) -> None:
        """Write a checkpoint of the current state. Call it on every rank, as in Lightning: each builds the
        contents (its callbacks' ``state_dict`` and ``on_save_checkpoint`` run), global rank 0 writes, all wait."""
        if self.lightning_module is None:
            raise AttributeError(
                "Saving a checkpoint is only possible if a model is attached to the Trainer. Did you call "
                "`Trainer.save_checkpoint()` before calling `Trainer.{fit,validate,test,predict}`?")
        ckpt = checkpoint.dump(self, weights_only)
        self.strategy.save_checkpoint(ckpt, os.fspath(filepath))  # rank 0's file, or every rank's shards (FSDP)
        if self.world_size > 1:
            self.strategy.barrier()

    def init_module(self, empty_init: bool | None = None) -> Any:
        """``with trainer.init_module(): model = Net()`` creates the weights on the device the run uses, in the
        precision's dtype (``"16-true"``: float16); ``empty_init=True`` skips their initialization (for weights
        loaded right after)."""
        return self.strategy.tensor_init_context(empty_init)  # the device, and the precision's dtype

    def remove_checkpoint(self, filepath: str | os.PathLike) -> None:
        self.strategy.remove_checkpoint(os.fspath(filepath))


def fit_rank(config: TrainerConfig, module: Module, train_dataloaders: Any = None, val_dataloaders: Any = None,
             datamodule: Any = None, ckpt_path: str | None = None, *, fit_id: str | None = None,
             resume: bool = False, position: dict[str, int] | None = None) -> dict[str, Any] | None:
    """Run one rank's share of a multi-process fit; return rank 0's result (None on other ranks).

    Call it in any process whose torchrun environment (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT...) is set, with the same arguments in
    every rank: loaders may be factories (zero-argument functions) built here.
    ``fit_id`` marks the checkpoints this fit writes; ``resume`` (a restarted
    attempt) continues from the newest of them instead of ``ckpt_path``. ``position`` holds the calling
    trainer's counters (``global_step``, ``current_epoch``, ``batches_stepped``) when it ran stages before.
    """
    trainer = Trainer.from_config(config)
    trainer._set_position(position)
    trainer.fit_id, trainer._resume_newest = fit_id, resume and fit_id is not None
    # a running fit, as Trainer.fit marks it: ModelCheckpoint saves only while the state says so
    trainer._begin(TrainerFn.FITTING, RunningStage.TRAINING)
    with _sigterm_sets_flag(trainer):  # a preemption's SIGTERM: checkpoint at the batch end, then stop
        trainer._call_and_handle_interrupt(trainer._fit_here, module, train_dataloaders, val_dataloaders,
                                           datamodule, ckpt_path)
    if not trainer.is_global_zero:
        return None
    if trainer._resume_newest:
        trainer.fit_info["resumed_from"] = trainer._resumed_from  # None: no checkpoint yet, started over
    return {
        "state_dict": {k: v.detach().cpu() for k, v in trainer.strategy.lightning_module_state_dict().items()},
        "global_step": trainer.global_step,
        "current_epoch": trainer.current_epoch,
        "batches_stepped": trainer.batches_stepped,
        "should_stop": trainer.should_stop,
        "callback_metrics": trainer.metric_store.cpu_copy(trainer.callback_metrics),
        "logged_metrics": trainer.metric_store.cpu_copy(trainer.logged_metrics),
        "callbacks": [cb.state_dict() for cb in trainer.callbacks],
        "loggers": loggers_mod.states_for_caller(trainer),
        "fit_info": trainer.fit_info,
    }


@contextlib.contextmanager
def _sigterm_sets_flag(trainer: Trainer):
    """While the rank fits, SIGTERM sets ``trainer.received_sigterm`` (Lightning's flag) instead of ending it."""
    def on_sigterm(signum, frame) -> None:
        trainer._received_sigterm = True

    try:
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread: signals cannot be caught here, a SIGTERM ends the process
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stage_rank(config: TrainerConfig, stage: str, module: Module, loaders: Any, datamodule: Any,
               ckpt_path: str | None, kw: dict[str, Any],
               position: dict[str, int] | None = None) -> dict[str, Any] | None:
    """One rank's share of a multi-process validate / test / predict; rank 0's output and metrics.
    ``position``: the calling trainer's counters (the step and epoch its logger writes at)."""
    trainer = Trainer.from_config(config)
    trainer._set_position(position)
    trainer._begin(TrainerFn(stage), RunningStage(stage))
    output = trainer._call_and_handle_interrupt(trainer._in_process, module, trainer._run_eval, stage, module, loaders,
                                                datamodule, ckpt_path, kw)
    if not trainer.is_global_zero:
        return None
    return {
        "output": output,
        "callback_metrics": trainer.metric_store.cpu_copy(trainer.callback_metrics),
        "logged_metrics": trainer.metric_store.cpu_copy(trainer.logged_metrics),
        "callbacks": [cb.state_dict() for cb in trainer.callbacks],
        "loggers": loggers_mod.states_for_caller(trainer),
    }


# Lightning's path for this module is ``<package>.trainer.trainer``: the same module under that name
sys.modules.setdefault(__name__ + ".trainer", sys.modules[__name__])
