"""Loggers: CSV built in, TensorBoard when ``tensorboard`` is installed, and the hosted services' (W&B, Comet,
MLflow, lightning.ai's LitLogger) when their library is (Lightning's ``loggers``), and how the Trainer drives them.

Only global rank 0 calls them. What they write is what Lightning's write for the same run:
``save_dir/name/version_N/`` with ``hparams.yaml`` (the hyperparameters ``save_hyperparameters``
saved, written when they are logged) and, for the CSV logger, ``metrics.csv`` (csv_logs.py).
The base class and the stand-ins of other ranks are in logger.py.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from gpulayer.trainer.loggers.comet import CometLogger
from gpulayer.trainer.loggers.csv_logs import CSVLogger
from gpulayer.trainer.loggers.litlogger import LitLogger
from gpulayer.trainer.loggers.logger import DummyExperiment, DummyLogger, Logger, rank_zero_experiment
from gpulayer.trainer.loggers.mlflow import MLFlowLogger
from gpulayer.trainer.loggers.tensorboard import TensorBoardLogger
from gpulayer.trainer.loggers.wandb import WandbLogger

__all__ = ["CSVLogger", "CometLogger", "DummyExperiment", "DummyLogger", "LitLogger", "Logger", "MLFlowLogger",
           "TensorBoardLogger", "WandbLogger", "rank_zero_experiment"]


def log_hyperparams(trainer: Any) -> None:
    """Lightning's rule at the start of a run: the module's and/or datamodule's saved hyperparameters, to every logger.

    Only what ``save_hyperparameters(logger=True)`` saved is logged; keys both define must agree.
    """
    loggers = trainer.loggers
    if not loggers or not trainer.is_global_zero:
        return
    module, dm = trainer.lightning_module, trainer.datamodule
    from_module = getattr(module, "_log_hyperparams", False)
    from_dm = getattr(dm, "_log_hyperparams", False) if dm is not None else False
    params = None
    if from_module and from_dm:
        mod_hp, dm_hp = module.hparams_initial, dm.hparams_initial
        clash = [k for k in mod_hp.keys() & dm_hp.keys() if k != "_class_path" and not _same_value(mod_hp[k], dm_hp[k])]
        if clash:
            raise RuntimeError(f"Error while merging hparams: the keys {clash} are present in both the "
                               "LightningModule's and LightningDataModule's hparams but have different values.")
        params = {**mod_hp, **dm_hp}
    elif from_module:
        params = module.hparams_initial
    elif from_dm:
        params = dm.hparams_initial
    for logger in loggers:
        if params is not None:
            logger.log_hyperparams({k: v for k, v in params.items() if k != "_class_path"})
        logger.log_graph(module)
        logger.save()


def _same_value(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a is b
    try:
        return bool(a == b)
    except Exception:
        return False


def finalize(trainer: Any, status: str = "success") -> None:
    """Every logger's ``finalize`` at the end of a run (fit, validate, test, predict), on global rank 0."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.finalize(status)


# -- loggers across the processes of a multi-process stage ------------------------------------------------
# Lightning's rank 0 is the process that called fit/validate/test/predict, so its loggers' state (the
# version, the CSV writer's columns, what a custom logger kept) is the caller's. Here the ranks are
# other processes: each stage hands them the loggers and takes rank 0's back.

@contextlib.contextmanager
def across_ranks(trainer: Any):
    """Around a stage in other processes, in the calling one: every rank agrees on version_N; when the ranks
    fail (no state comes back), a CSV logger whose directory now exists appends there next time."""
    for logger in trainer.loggers:
        getattr(logger, "version", None)
    try:
        yield
    except BaseException:
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger) and os.path.isdir(logger.log_dir):
                logger._opened = True
        raise


def states_for_caller(trainer: Any) -> list[bytes | None]:
    """In rank 0 after a stage: each logger pickled (None where it no longer pickles) for ``adopt``."""
    import cloudpickle
    states: list[bytes | None] = []
    for logger in trainer.loggers:
        try:
            states.append(cloudpickle.dumps(logger))
        except Exception:  # a custom logger holding something that cannot travel: the caller keeps its copy
            states.append(None)
    return states


def adopt(trainer: Any, states: list[bytes | None] | None) -> None:
    """In the calling process: rank 0's loggers' state into the caller's own logger objects (kept by identity)."""
    import cloudpickle
    for mine, blob in zip(trainer.loggers, states or []):
        if blob is None:
            continue
        theirs = cloudpickle.loads(blob)
        # by position, and by class name: a class pickled by value comes back as a new class object
        if type(theirs).__qualname__ == type(mine).__qualname__ and hasattr(mine, "__dict__"):
            mine.__dict__.update(vars(theirs))
