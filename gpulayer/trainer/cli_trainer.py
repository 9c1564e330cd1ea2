"""The Trainer's arguments as a typed signature, for ``LightningCLI`` (``gpulayer/trainer/cli.py``).

``Trainer`` takes ``**kwargs``, so jsonargparse cannot read its arguments from it; this function
has the same arguments with their types, defaults and help, and builds the Trainer.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional, Union

from gpulayer.trainer.callbacks import Callback
from gpulayer.trainer.loggers import Logger
from gpulayer.trainer.profilers import Profiler
from gpulayer.trainer.trainer import Trainer


def _trainer(
    accelerator: str = "auto",
    strategy: str = "auto",
    devices: Union[list[int], str, int] = "auto",
    num_nodes: int = 1,
    precision: Optional[Union[int, str]] = None,
    logger: Optional[Union[Logger, bool]] = None,
    callbacks: Optional[Union[list[Callback], Callback]] = None,
    fast_dev_run: Union[int, bool] = False,
    max_epochs: Optional[int] = None,
    min_epochs: Optional[int] = None,
    max_steps: int = -1,
    min_steps: Optional[int] = None,
    max_time: Optional[Union[str, dict[str, int]]] = None,
    limit_train_batches: Optional[Union[int, float]] = None,
    limit_val_batches: Optional[Union[int, float]] = None,
    limit_test_batches: Optional[Union[int, float]] = None,
    limit_predict_batches: Optional[Union[int, float]] = None,
    overfit_batches: Union[int, float] = 0.0,
    reload_dataloaders_every_n_epochs: int = 0,
    val_check_interval: Union[int, float] = 1.0,
    check_val_every_n_epoch: Optional[int] = 1,
    num_sanity_val_steps: int = 2,
    log_every_n_steps: int = 50,
    enable_checkpointing: bool = True,
    enable_progress_bar: Optional[bool] = None,
    enable_model_summary: Optional[bool] = None,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: Optional[Union[int, float]] = None,
    gradient_clip_algorithm: Optional[str] = None,
    deterministic: Optional[Union[bool, str]] = None,
    benchmark: Optional[bool] = None,
    inference_mode: bool = True,
    use_distributed_sampler: bool = True,
    default_root_dir: Optional[str] = None,
    prefetch: bool = True,
    grad_sync: str = "auto",
    max_restarts: int = 0,
    priority: int = 0,
    profiler: Optional[Union[Profiler, str]] = None,
    detect_anomaly: bool = False,
    barebones: bool = False,
    plugins: Optional[Any] = None,
    sync_batchnorm: bool = False,
) -> Trainer:
    """The Trainer's arguments with types, for jsonargparse (``Trainer`` itself takes ``**kwargs``).

    Args:
        accelerator: "cpu", "cuda", "gpu" or "auto".
        strategy: "auto", "ddp" or "ddp_spawn" (the same launcher: fresh rank processes, weights back in the caller).
        devices: processes on this machine (an int, a list of GPU indices, or "auto").
        num_nodes: machines; more than 1 runs the fit on the cluster.
        precision: "32-true" (None: the default), "16-mixed", "bf16-mixed", "16-true", "bf16-true" or "64-true".
        logger: a logger, True (a CSVLogger) or False (none).
        callbacks: callbacks to add.
        fast_dev_run: run n (or 1) batches of train, val and test to find bugs.
        max_epochs: stop after this many epochs (default 1000, or unlimited when max_steps is set).
        min_epochs: train at least this many epochs.
        max_steps: stop after this many optimizer steps (-1: no limit).
        min_steps: train at least this many steps.
        max_time: stop after this long ("DD:HH:MM:SS" or a dict of timedelta fields).
        limit_train_batches: batches per epoch (int) or fraction of the loader (float).
        limit_val_batches: validation batches (int) or fraction (float).
        limit_test_batches: test batches (int) or fraction (float).
        limit_predict_batches: predict batches (int) or fraction (float).
        overfit_batches: train and validate on this many first batches (int) or fraction (float), unshuffled.
        reload_dataloaders_every_n_epochs: request the train and val loaders again every n epochs (0: never).
        val_check_interval: validate every n train batches (int) or fraction of an epoch (float).
        check_val_every_n_epoch: validate every n epochs.
        num_sanity_val_steps: validation batches before training (-1: all).
        log_every_n_steps: how often to log within steps.
        enable_checkpointing: add a ModelCheckpoint when none is given.
        enable_progress_bar: show the progress bar (default: on; one line per epoch when stdout is not a terminal).
        enable_model_summary: print a summary of the model before fitting.
        accumulate_grad_batches: accumulate gradients over k batches before stepping.
        gradient_clip_val: clip gradients at this value (None: no clipping).
        gradient_clip_algorithm: "norm" or "value" (None: "norm").
        deterministic: use deterministic algorithms (True, False or "warn").
        benchmark: cuDNN autotuning (default: on unless deterministic).
        inference_mode: torch.inference_mode (else no_grad) in evaluation.
        use_distributed_sampler: insert a DistributedSampler with several processes.
        default_root_dir: where logs and checkpoints go (default: the working directory).
        prefetch: copy the next batch to the device during the current step (gpulayer).
        grad_sync: "auto", "two_level" or "flat" gradient synchronisation (gpulayer).
        max_restarts: with num_nodes > 1, restart the fit on live workers from its newest checkpoint after a rank
            or a worker fails, up to this many times (gpulayer).
        priority: with num_nodes > 1, the fit's priority on the cluster, 0 (lowest) to 9: higher is placed first
            and may preempt running fits and gangs of lower priority, which checkpoint and resume (gpulayer).
        profiler: "simple", "advanced", "pytorch" or a Profiler: time the hooks, steps and batch fetches.
        detect_anomaly: autograd's anomaly detection (slow; names the operation that produced a NaN).
        barebones: turn off everything that costs speed (checkpoints, logging, progress bar, summary...).
        plugins: precision, CheckpointIO, ClusterEnvironment and LayerSync plugins (``gpulayer.trainer.plugins``),
            one or a list.
        sync_batchnorm: a multi-process run turns BatchNorm layers into SyncBatchNorm (``TorchSyncBatchNorm``).
    """
    given = dict(locals())  # a copy: the frame's dict would gain the names bound below under a tracer
    # arguments left at their defaults are not passed: Trainer applies the same ones, and barebones=True
    # refuses an explicit enable_checkpointing=True or log_every_n_steps=50
    defaults = {name: p.default for name, p in inspect.signature(_trainer).parameters.items()}
    return Trainer(**{k: v for k, v in given.items() if not (v is defaults[k] or type(v) is type(defaults[k])
                                                              and v == defaults[k])})


def init_signature() -> inspect.Signature:
    """``Trainer.__init__``'s signature as ``inspect`` reports it: ``self`` and the typed arguments above."""
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    # annotations resolved here: a reader of Trainer.__init__ evaluates them in trainer.py, which lacks these names
    params = [p.replace(annotation=eval(p.annotation, globals())) if isinstance(p.annotation, str) else p
              for p in inspect.signature(_trainer).parameters.values()]
    return inspect.Signature([self_param, *params], return_annotation=None)


# `Trainer(**kwargs)` validates by name (config.py); inspect, IDEs and LightningCLI's help read the typed
# arguments from here (the package's __init__ imports this module, so every Trainer has them)
Trainer.__init__.__signature__ = init_signature()
