"""``DeviceStatsMonitor``: the device's memory (and the host's CPU) statistics, logged around each batch.

At each train, validation and test batch start and end, on a logging step, it logs the root device's statistics
under ``DeviceStatsMonitor.on_train_batch_start{sep}<name>``...: on CUDA ``torch.cuda.memory_stats`` (with the CPU's
when ``cpu_stats=True``), on CPU ``cpu_percent``, ``cpu_vm_percent``, ``cpu_swap_percent`` from ``psutil``.
It needs a logger; the statistics are read only on logging steps (they cost a few system calls).
"""

from __future__ import annotations

from typing import Any

import torch

from gpulayer.trainer.accelerators.cpu import CPUAccelerator, get_cpu_stats
from gpulayer.trainer.accelerators.cuda import CUDAAccelerator
from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.callbacks.log_steps import eval_log_due, step_at_train_batch_end, train_log_due
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.utilities.imports import _available

_PSUTIL_AVAILABLE = _available("psutil")


def get_device_stats(device: torch.device) -> dict[str, Any]:
    """The statistics of ``device`` as its kind's accelerator reports them (CUDA's allocator counters, or the
    host's for a CPU): for a trainer without an accelerator object."""
    accelerator = CUDAAccelerator() if device.type == "cuda" else CPUAccelerator()
    return accelerator.get_device_stats(device)


def _prefix_metric_keys(metrics: dict[str, Any], prefix: str, separator: str) -> dict[str, Any]:
    return {f"{prefix}{separator}{k}": v for k, v in metrics.items()}


class DeviceStatsMonitor(Callback):
    """Log device statistics during training, validation and test.

    ``cpu_stats``: ``None`` (default) logs the CPU's only when the CPU is the device, ``True`` always (besides a
    GPU's), ``False`` never. Raises ``MisconfigurationException`` at ``fit`` without a logger.

    >>> Trainer(callbacks=[DeviceStatsMonitor()], logger=CSVLogger("logs"))   # doctest: +SKIP
    """

    def __init__(self, cpu_stats: bool | None = None) -> None:
        self._cpu_stats = cpu_stats

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if not trainer.loggers:
            raise MisconfigurationException("Cannot use `DeviceStatsMonitor` callback with `Trainer(logger=False)`.")
        if self._cpu_stats is None and trainer.strategy.root_device.type == "cpu" and not _PSUTIL_AVAILABLE:
            raise ModuleNotFoundError("`DeviceStatsMonitor` cannot log CPU stats as `psutil` is not installed. "
                                      "Install it with `pip install psutil`, or pass `cpu_stats=False`.")

    def _log_stats(self, trainer: Any, key: str, due: bool, step: int) -> None:
        if not due or not trainer.loggers or not trainer.is_global_zero:
            return
        device = trainer.strategy.root_device
        if device.type == "cpu" and self._cpu_stats is False:
            return
        accelerator = getattr(trainer, "accelerator", None)
        stats = accelerator.get_device_stats(device) if accelerator is not None else get_device_stats(device)
        if self._cpu_stats and device.type != "cpu":
            stats.update(get_cpu_stats())
        for logger in trainer.loggers:
            sep = getattr(logger, "group_separator", "/")
            logger.log_metrics(_prefix_metric_keys(stats, f"{type(self).__qualname__}.{key}", sep), step=step)

    # training: a logging step by the optimizer steps taken (Lightning's ``log_every_n_steps`` rule)
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._log_stats(trainer, "on_train_batch_start", train_log_due(trainer, trainer.batches_stepped),
                        trainer.batches_stepped)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = step_at_train_batch_end(trainer, batch_idx)
        self._log_stats(trainer, "on_train_batch_end", train_log_due(trainer, step), step)

    # evaluation: a logging step by the batches of this run
    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        self._log_stats(trainer, "on_validation_batch_start", eval_log_due(trainer, batch_idx), trainer.batches_stepped)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self._log_stats(trainer, "on_validation_batch_end", eval_log_due(trainer, batch_idx), trainer.batches_stepped)

    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        self._log_stats(trainer, "on_test_batch_start", eval_log_due(trainer, batch_idx), trainer.batches_stepped)

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        self._log_stats(trainer, "on_test_batch_end", eval_log_due(trainer, batch_idx), trainer.batches_stepped)

