"""``Trainer``: Lightning's arguments and ``fit``, a faster loop underneath.

``fit`` runs in this process (one device), starts ``devices`` processes on this
machine (``launcher.py``), or, with ``num_nodes > 1``, submits one distributed
job of ``num_nodes x devices`` ranks to the cluster (``cluster.py``). Each rank
runs ``fit_rank`` and rank 0 hands its weights and metrics back. ``fit_rank``
works in any process whose torchrun environment is set.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from gpulayer.trainer import checkpoint, data, gcfreeze, optimizers
from gpulayer.trainer.callbacks import Callback, EarlyStopping, ModelCheckpoint
from gpulayer.trainer.config import TrainerConfig, build_config
from gpulayer.trainer.errors import TrainerConfigError, TrainerError
from gpulayer.trainer.hooks import Hooks
from gpulayer.trainer.loop import FitLoop
from gpulayer.trainer.metrics import MetricStore
from gpulayer.trainer.module import Module
from gpulayer.trainer.precision import Precision, make_precision
from gpulayer.trainer.strategies import DDPStrategy, SingleDeviceStrategy

_UNSET: Any = object()


def _in_matching_job(cfg: TrainerConfig) -> bool:
    """True inside a launched rank (torchrun, gpulayer) whose world matches devices x num_nodes."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) == cfg.devices * cfg.num_nodes


class Trainer:
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
    (default: on when stdout is a terminal), ``default_root_dir``,
    ``fast_dev_run``. gpulayer adds ``prefetch`` (copy the next batch to the GPU
    during the current step), ``grad_sync`` (``"auto"``, ``"two_level"``,
    ``"flat"``: see ``gradsync.py``) and ``cluster_resources`` (a
    ``gpulayer.Resources`` the workers of a ``num_nodes > 1`` fit must offer).

    ``Trainer(num_nodes=2, devices=4).fit(model)`` runs on the cluster this
    process is connected to (``gpulayer.init``): each rank builds its data from
    ``model.train_dataloader()``, a loader factory (``fit(model, make_loader)``)
    or a datamodule, so datasets never travel; ``fit_info`` says how it ran.
    """

    def __init__(self, **kwargs: Any) -> None:
        self._config = build_config(**kwargs)
        self._init_state()

    @classmethod
    def from_config(cls, config: TrainerConfig) -> "Trainer":
        """A Trainer for an already-validated config (what ``fit_rank`` uses inside each rank)."""
        trainer = cls.__new__(cls)
        trainer._config = config
        trainer._init_state()
        return trainer

    def _init_state(self) -> None:
        self.global_step = 0
        self.current_epoch = 0
        self.should_stop = False
        self.sanity_checking = False
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_scheduler_configs: list[optimizers.SchedulerConfig] = []
        self.strategy: SingleDeviceStrategy | None = None
        self.lightning_module: Module | None = None
        self.has_val_loader = False
        self.num_training_batches: float = 0
        self._precision: Precision | None = None
        self._hooks: Hooks | None = None
        self._loop: FitLoop | None = None
        self._store = MetricStore()
        self.fit_info: dict[str, Any] = {}  # strategy, world, grad sync (and job, placement on the cluster)

    # -- what callbacks and modules read ----------------------------------------------------
    callbacks = property(lambda self: self._config.callbacks)
    logger = property(lambda self: self._config.logger)
    loggers = property(lambda self: [self._config.logger] if self._config.logger is not None else [])
    default_root_dir = property(lambda self: self._config.default_root_dir)
    max_epochs = property(lambda self: self._config.max_epochs)
    max_steps = property(lambda self: self._config.max_steps)
    val_check_interval = property(lambda self: self._config.val_check_interval)
    check_val_every_n_epoch = property(lambda self: self._config.check_val_every_n_epoch)
    log_every_n_steps = property(lambda self: self._config.log_every_n_steps)
    accumulate_grad_batches = property(lambda self: self._config.accumulate_grad_batches)
    precision = property(lambda self: self._config.precision)
    num_nodes = property(lambda self: self._config.num_nodes)
    num_devices = property(lambda self: self._config.devices)
    model = property(lambda self: self.lightning_module)
    global_rank = property(lambda self: self.strategy.global_rank if self.strategy else 0)
    local_rank = property(lambda self: self.strategy.local_rank if self.strategy else 0)
    world_size = property(lambda self: self.strategy.world_size if self.strategy else 1)
    is_global_zero = property(lambda self: self.strategy.is_global_zero if self.strategy else True)
    checkpoint_callbacks = property(lambda self: [c for c in self.callbacks if isinstance(c, ModelCheckpoint)])
    checkpoint_callback = property(lambda self: next(iter(self.checkpoint_callbacks), None))
    early_stopping_callback = property(lambda self: next((c for c in self.callbacks if isinstance(c, EarlyStopping)), None))

    @property
    def log_dir(self) -> str:
        return self.logger.log_dir if self.logger is not None else self.default_root_dir

    @property
    def callback_metrics(self) -> dict[str, Any]:
        """Latest step values and epoch means as 0-dim tensors, like Lightning's."""
        return self._store.callback_metrics()

    @property
    def logged_metrics(self) -> dict[str, float]:
        return dict(self._store.logged)

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        return dict(self._store.progress)

    @property
    def is_log_step(self) -> bool:
        return self.global_step % self._config.log_every_n_steps == 0

    # -- fit ------------------------------------------------------------------------------------
    def fit(self, model: Module, train_dataloaders: Any = None, val_dataloaders: Any = None, datamodule: Any = None,
            ckpt_path: str | None = None) -> None:
        """Train ``model``; loaders may also come from ``model.train_dataloader()`` or a ``datamodule``.

        ``ckpt_path`` resumes from a checkpoint (a path, ``"last"`` or ``"best"``),
        restoring weights, optimizers, schedulers, the loss scaler, loop position
        and random states so the run continues as if never interrupted.
        """
        if not isinstance(model, Module):
            raise TrainerConfigError(
                f"Trainer.fit got {type(model).__name__}; the model must subclass gpulayer.trainer.Module "
                "(for a Lightning module, change `from lightning import LightningModule` to "
                "`from gpulayer.trainer import Module`)"
            )
        if datamodule is not None and (train_dataloaders is not None or val_dataloaders is not None):
            raise TrainerConfigError("fit() got both a datamodule and data loaders; pass one or the other")
        cfg = self._config
        if cfg.multi_process and not _in_matching_job(cfg):
            from gpulayer.trainer import cluster, launcher
            if cfg.logger is not None:
                cfg.logger.version  # fix version_N here so every rank agrees on the directory
            run = cluster.fit_on_cluster if cfg.num_nodes > 1 else launcher.fit_in_processes
            result = run(cfg, model, train_dataloaders, val_dataloaders, datamodule, ckpt_path)
            self._take_result(model, result)
            return
        self._fit_here(model, train_dataloaders, val_dataloaders, datamodule, ckpt_path)

    def _fit_here(self, module: Module, train_dataloaders: Any, val_dataloaders: Any, datamodule: Any,
                  ckpt_path: str | None) -> None:
        cfg = self._config
        device = torch.device("cuda", cfg.device_ids[0] if cfg.device_ids else 0) if cfg.accelerator == "cuda" \
            else torch.device("cpu")
        if cfg.multi_process:
            if cfg.accelerator == "cuda" and cfg.device_ids:
                device = torch.device("cuda", cfg.device_ids[int(os.environ.get("LOCAL_RANK", "0"))])
            self.strategy = DDPStrategy(device if cfg.accelerator == "cuda" else None, cfg.grad_sync,
                                        find_unused_parameters=cfg.strategy == "ddp_find_unused_parameters_true")
        else:
            self.strategy = SingleDeviceStrategy(device)
        self.strategy.setup_environment()
        self._setup_backends()
        self._store = MetricStore(self.strategy.reduce if self.strategy.world_size > 1 else None)
        self._precision = make_precision(cfg.precision, device.type)
        self.lightning_module = module
        module.trainer = self
        module._metric_store = self._store
        self.fit_info = self.strategy.describe()
        try:
            self._run(module, train_dataloaders, val_dataloaders, datamodule, ckpt_path)
            # every rank is done with its collectives before any destroys the group: a rank whose
            # peer tore gloo down under it can abort at exit ("terminate called without an active exception")
            self.strategy.barrier()
        finally:
            self.fit_info = self.strategy.describe()  # now with the comm hook DDP got
            module._metric_store = None
            self.strategy.teardown()

    def _setup_backends(self) -> None:
        cfg = self._config
        torch.backends.cudnn.benchmark = cfg.benchmark
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=cfg.deterministic == "warn")
            torch.backends.cudnn.deterministic = True
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    def _run(self, module: Module, train: Any, val: Any, datamodule: Any, ckpt_path: str | None) -> None:
        cfg = self._config
        extra = module.configure_callbacks() or []
        cfg.callbacks = cfg.callbacks + [c for c in (extra if isinstance(extra, (list, tuple)) else [extra])
                                         if isinstance(c, Callback) and c not in cfg.callbacks]
        self._hooks = hooks = Hooks(self, module, cfg.callbacks)
        if datamodule is not None:
            if hasattr(datamodule, "setup"):
                datamodule.setup("fit")
            train, val = datamodule.train_dataloader(), getattr(datamodule, "val_dataloader", lambda: None)()
        hooks.call("setup", "fit")
        train = data.resolve(train) if train is not None else module.train_dataloader()
        if train is None:
            raise TrainerConfigError(
                "no training data: pass train_dataloaders to fit(model, train_loader) or define train_dataloader() on the module"
            )
        if isinstance(train, (list, tuple)):
            raise TrainerConfigError("fit() takes one training loader; combine several into one dataset or loader")
        val = data.resolve(val) if val is not None else module.val_dataloader()
        val_loaders = [self.strategy.prepare_loader(v) for v in data.as_list(val)]
        train = self.strategy.prepare_loader(train)
        for loader in [train, *val_loaders]:
            data.seed_workers(loader)
        self.has_val_loader = bool(val_loaders) and type(module).validation_step is not Module.validation_step
        if not self.has_val_loader:
            val_loaders = []

        step_fn = self.strategy.setup_module(module)
        self.optimizers, self.lr_scheduler_configs = optimizers.parse(module.configure_optimizers())
        if module.automatic_optimization and len(self.optimizers) > 1:
            raise TrainerConfigError(
                f"configure_optimizers returned {len(self.optimizers)} optimizers; as in Lightning 2, several optimizers "
                "need manual optimization: set self.automatic_optimization = False and call opt.step() in training_step"
            )
        hooks.call("on_fit_start")
        resume = self._restore(ckpt_path) if ckpt_path is not None else None
        if self.logger is not None and self.is_global_zero:
            self.logger.log_hyperparams(module.hparams)  # also creates version_N now, as Lightning does
        self._loop = FitLoop(self, module, step_fn, train, val_loaders, resume)
        self.num_training_batches = self._loop.num_train_batches
        try:
            with gcfreeze.frozen():
                self._loop.run()
        finally:
            if self.logger is not None and self.is_global_zero:
                self.logger.finalize("success")
        hooks.call("on_fit_end")
        hooks.call("teardown", "fit")

    def _restore(self, ckpt_path: str) -> dict[str, Any]:
        path = ckpt_path
        if ckpt_path in ("last", "best"):
            cbs = self.checkpoint_callbacks
            if ckpt_path == "best":
                path = next((c.best_model_path for c in cbs if c.best_model_path), None)
            else:
                candidates = [c.last_model_path for c in cbs if c.last_model_path]
                candidates += [os.path.join(c.dirpath, "last.ckpt") for c in cbs if c.dirpath]
                path = next((p for p in candidates if os.path.isfile(p)), None)
            if path is None:
                raise TrainerError(
                    f"fit(ckpt_path={ckpt_path!r}) found no {ckpt_path} checkpoint (ModelCheckpoint dirs: "
                    f"{[c.dirpath for c in cbs]}); use ModelCheckpoint(save_last=True) or pass a file path"
                )
        return checkpoint.restore(self, checkpoint.load(os.fspath(path)))

    def _take_result(self, module: Module, result: dict[str, Any]) -> None:
        """Rank 0's weights, counters, metrics and callback states, into this process's objects."""
        module.load_state_dict(result["state_dict"])
        self.lightning_module = module
        self.global_step, self.current_epoch = result["global_step"], result["current_epoch"]
        self.fit_info = dict(result.get("fit_info", {}))
        self._store.load_result(result["callback_metrics"], result["logged_metrics"])
        # by position: the ranks hold copies of these callbacks in the same order (class names of
        # by-value pickled classes may differ, so state_key is not reliable across processes)
        for cb, state in zip(self.callbacks, result["callbacks"]):
            cb.load_state_dict(state)

    # -- used by the loop at log intervals and epoch ends ----------------------------------------
    def _log_step_metrics(self, to_logger: bool = True) -> None:
        metrics = self._store.materialize_step(sync=to_logger)
        if to_logger and metrics and self.logger is not None and self.is_global_zero:
            self.logger.log_metrics({**metrics, "epoch": self.current_epoch}, step=self.global_step - 1)

    def _log_epoch_metrics(self, metrics: dict[str, float]) -> None:
        if metrics and self.logger is not None and self.is_global_zero:
            self.logger.log_metrics({**metrics, "epoch": self.current_epoch}, step=max(self.global_step - 1, 0))

    def log_to_logger(self, metrics: dict[str, float]) -> None:
        """For callbacks: send numbers straight to the logger (rank 0)."""
        if self.logger is not None and self.is_global_zero:
            self.logger.log_metrics(metrics, step=max(self.global_step - 1, 0))

    def _step_scheduler(self, cfg: optimizers.SchedulerConfig) -> None:
        metric = None
        if cfg.reduce_on_plateau:
            metrics = self.callback_metrics
            if cfg.monitor not in metrics:
                if not cfg.strict:
                    return
                raise TrainerError(
                    f"the ReduceLROnPlateau scheduler monitors {cfg.monitor!r}, which was not logged "
                    f"(available: {sorted(metrics)}); log it with self.log({cfg.monitor!r}, value)"
                )
            metric = float(metrics[cfg.monitor])
        self.lightning_module.lr_scheduler_step(cfg.scheduler, metric)

    # -- checkpoints --------------------------------------------------------------------------------
    def save_checkpoint(self, filepath: str | os.PathLike, weights_only: bool = False) -> None:
        """Write a checkpoint of the current state (global rank 0 writes; others return)."""
        if self.lightning_module is None:
            raise TrainerError("save_checkpoint needs a model: call it during or after fit()")
        if not self.is_global_zero:
            return
        checkpoint.save(checkpoint.dump(self, weights_only), os.fspath(filepath))

    def remove_checkpoint(self, filepath: str | os.PathLike) -> None:
        if self.is_global_zero and os.path.isfile(filepath):
            os.remove(filepath)


def fit_rank(config: TrainerConfig, module: Module, train_dataloaders: Any = None, val_dataloaders: Any = None,
             datamodule: Any = None, ckpt_path: str | None = None) -> dict[str, Any] | None:
    """Run one rank's share of a multi-process fit; return rank 0's result (None on other ranks).

    Call it in any process whose torchrun environment (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT...) is set, with the same arguments in
    every rank: loaders may be factories (zero-argument functions) built here.
    """
    trainer = Trainer.from_config(config)
    trainer._fit_here(module, train_dataloaders, val_dataloaders, datamodule, ckpt_path)
    if not trainer.is_global_zero:
        return None
    return {
        "state_dict": {k: v.detach().cpu() for k, v in module.state_dict().items()},
        "global_step": trainer.global_step,
        "current_epoch": trainer.current_epoch,
        "callback_metrics": {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v)
                             for k, v in trainer.callback_metrics.items()},
        "logged_metrics": trainer.logged_metrics,
        "callbacks": [cb.state_dict() for cb in trainer.callbacks],
        "fit_info": trainer.fit_info,
    }
