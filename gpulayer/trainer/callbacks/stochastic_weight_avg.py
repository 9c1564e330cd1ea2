"""``StochasticWeightAveraging``: average the weights of the last epochs (Izmailov et al., UAI 2018; Lightning's).

From epoch ``swa_epoch_start`` on, the learning rate follows torch's ``SWALR`` (annealed to ``swa_lrs`` over
``annealing_epochs``), which takes the place of the module's scheduler, and at the start of each epoch up to the
last the weights are added to an equal-weight running average kept in a copy of the module. When the fit ends the
module gets the averaged weights; a module with batch norm then gets its running statistics recomputed for them
with one pass over the training data, without gradients (torch's ``swa_utils.update_bn``, through the module's
own ``training_step``; nothing is logged in it).

Where Lightning differs: it runs that statistics pass as one more training epoch (``current_epoch`` ends one
higher, the epoch-end hooks and checkpoints run once more); gpulayer runs it inside ``on_train_end``, so the
trainer's counters are those of the epochs asked for. The averaged weights are the same.

>>> trainer = Trainer(max_epochs=20, callbacks=StochasticWeightAveraging(swa_lrs=1e-2))   # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import math
from copy import deepcopy
from typing import Any, Callable, Literal

import torch
from torch import nn
from torch.optim.swa_utils import SWALR, get_swa_avg_fn

from gpulayer.trainer import data
from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.optimizers import SchedulerConfig
from gpulayer.trainer.utilities.rank_zero import rank_zero_info, rank_zero_warn

AvgFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_BATCH_NORM = nn.modules.batchnorm._BatchNorm


class StochasticWeightAveraging(Callback):
    """``swa_lrs``: the SWA learning rate, one for all parameter groups or one per group. ``swa_epoch_start``:
    an epoch (int >= 1, counted from 1) or a fraction of ``max_epochs``. ``avg_fn(average, current, n_averaged)``
    replaces the equal-weight mean; ``device`` holds the average (default CPU; ``None``: the module's device).
    One optimizer and at most one scheduler."""

    def __init__(self, swa_lrs: float | list[float], swa_epoch_start: int | float = 0.8, annealing_epochs: int = 10,
                 annealing_strategy: Literal["cos", "linear"] = "cos", avg_fn: AvgFn | None = None,
                 device: torch.device | str | None = torch.device("cpu")) -> None:
        bad_start = ((isinstance(swa_epoch_start, int) and swa_epoch_start < 1)
                     or (isinstance(swa_epoch_start, float) and not 0 <= swa_epoch_start <= 1))
        if bad_start:
            raise MisconfigurationException("swa_epoch_start should be a >0 integer or a float between 0 and 1.")
        positive = (isinstance(swa_lrs, float) and swa_lrs > 0) or (
            isinstance(swa_lrs, list) and all(isinstance(lr, float) and lr > 0 for lr in swa_lrs))
        if not positive:
            raise MisconfigurationException("The `swa_lrs` should a positive float, or a list of positive floats")
        if avg_fn is not None and not callable(avg_fn):
            raise MisconfigurationException("The `avg_fn` should be callable.")
        if device is not None and not isinstance(device, (torch.device, str)):
            raise MisconfigurationException(f"device is expected to be a torch.device or a str. Found {device}")
        self.n_averaged: torch.Tensor | None = None
        self._swa_epoch_start = swa_epoch_start
        self._swa_lrs = swa_lrs
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._avg_fn = avg_fn or self.avg_fn
        self._device = device
        self._average_model: nn.Module | None = None  # a copy of the module holding the average
        self._model_contains_batch_norm: bool | None = None
        self._initialized = False
        self._swa_scheduler: Any = None
        self._scheduler_state: dict | None = None  # from a checkpoint, for the SWALR the resumed fit makes
        self._init_n_averaged = 0
        self._latest_update_epoch = -1
        self._max_epochs: int = -1
        self.momenta: dict[nn.Module, float | None] = {}

    @property
    def swa_start(self) -> int:
        """The first averaged epoch, 0-based."""
        return max(int(self._swa_epoch_start) - 1, 0)

    @property
    def swa_end(self) -> float:
        """The last averaged epoch, 0-based (infinite with ``max_epochs=-1``)."""
        return math.inf if self._max_epochs == -1 else self._max_epochs - 1

    @staticmethod
    def pl_module_contains_batch_norm(pl_module: nn.Module) -> bool:
        return any(isinstance(m, _BATCH_NORM) for m in pl_module.modules())

    @staticmethod
    def avg_fn(averaged_model_parameter: torch.Tensor, model_parameter: torch.Tensor,
               num_averaged: torch.Tensor) -> torch.Tensor:
        """The equal-weight running mean (torch's ``get_swa_avg_fn``)."""
        return _SWA_MEAN(averaged_model_parameter, model_parameter, num_averaged)

    @staticmethod
    def update_parameters(average_model: nn.Module, model: nn.Module, n_averaged: torch.Tensor,
                          avg_fn: AvgFn) -> None:
        """Add ``model``'s parameters to the average held in ``average_model`` (the first one is copied)."""
        for p_avg, p_model in zip(average_model.parameters(), model.parameters()):
            avg, current = p_avg.detach(), p_model.detach().to(p_avg.device)
            avg.copy_(current if n_averaged == 0 else avg_fn(avg, current, n_averaged.to(p_avg.device)))
        n_averaged += 1

    @staticmethod
    def transfer_weights(src_pl_module: nn.Module, dst_pl_module: nn.Module) -> None:
        for src, dst in zip(src_pl_module.parameters(), dst_pl_module.parameters()):
            dst.detach().copy_(src.to(dst.device))

    # -- hooks ---------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        if "fsdp" in type(trainer.strategy).__name__.lower() or "deepspeed" in type(trainer.strategy).__name__.lower():
            raise MisconfigurationException("SWA does not currently support sharded models.")
        self._average_model = deepcopy(pl_module)  # the module's copy leaves its Trainer and loaders behind

    def on_fit_start(self, trainer, pl_module) -> None:
        if len(trainer.optimizers) != 1:
            raise MisconfigurationException("SWA currently works with 1 `optimizer`.")
        if len(trainer.lr_scheduler_configs) > 1:
            raise MisconfigurationException("SWA currently not supported for more than 1 `lr_scheduler`.")
        if isinstance(self._swa_epoch_start, float):
            if trainer.max_epochs == -1:
                raise MisconfigurationException("SWA with `swa_epoch_start` as a float is not supported when "
                                                "`max_epochs=-1`. Please provide `swa_epoch_start` as an integer.")
            self._swa_epoch_start = int(trainer.max_epochs * self._swa_epoch_start)
        self._model_contains_batch_norm = self.pl_module_contains_batch_norm(pl_module)
        self._max_epochs = trainer.max_epochs
        if self._scheduler_state is not None:  # resumed inside the SWA phase: its SWALR comes back at epoch start
            trainer.lr_scheduler_configs.clear()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        epoch = trainer.current_epoch
        in_swa = self.swa_start <= epoch <= self.swa_end
        if in_swa and not self._initialized:
            self._initialized = True
            self._start_swa(trainer, pl_module)
        if in_swa and epoch > self._latest_update_epoch:
            self.update_parameters(self._average_model, pl_module, self.n_averaged, self._avg_fn)
            self._latest_update_epoch = epoch

    def _start_swa(self, trainer, pl_module) -> None:
        """Move the average where it lives and put ``SWALR`` in place of the module's scheduler."""
        self._average_model = self._average_model.to(self._device or pl_module.device)
        optimizer = trainer.optimizers[0]
        if isinstance(self._swa_lrs, float):
            self._swa_lrs = [self._swa_lrs] * len(optimizer.param_groups)
        for lr, group in zip(self._swa_lrs, optimizer.param_groups):
            group["initial_lr"] = lr
        self._swa_scheduler = SWALR(optimizer, swa_lr=self._swa_lrs, anneal_epochs=self._annealing_epochs,
                                    anneal_strategy=self._annealing_strategy,
                                    last_epoch=trainer.max_epochs if self._annealing_strategy == "cos" else -1)
        if self._scheduler_state is not None:
            self._swa_scheduler.load_state_dict(self._scheduler_state)
        elif trainer.current_epoch != self.swa_start:
            rank_zero_warn("SWA is initializing after swa_start without any checkpoint data. This may be caused by "
                           "loading a checkpoint from an older version of PyTorch Lightning.")
        swa_config = SchedulerConfig(self._swa_scheduler)
        if trainer.lr_scheduler_configs:
            current = trainer.lr_scheduler_configs[0]
            if current.interval != "epoch" or current.frequency != 1:
                rank_zero_warn(f"SWA is currently only supported every epoch. Found {current}")
            rank_zero_info(f"Swapping scheduler `{type(current.scheduler).__name__}` for "
                           f"`{type(self._swa_scheduler).__name__}`")
            trainer.lr_scheduler_configs[0] = swa_config
        else:
            trainer.lr_scheduler_configs.append(swa_config)
        if self.n_averaged is None:
            self.n_averaged = torch.tensor(self._init_n_averaged, dtype=torch.long, device=pl_module.device)

    def on_train_end(self, trainer, pl_module) -> None:
        reached_end = trainer.current_epoch - 1 >= self.swa_end or self._max_epochs == -1
        if not (self._initialized and reached_end and self._average_model is not None):
            return
        self.transfer_weights(self._average_model, pl_module)
        if self._model_contains_batch_norm:
            self.reset_batch_norm_and_save_state(pl_module)
            try:
                self._recompute_batch_norm(trainer, pl_module)
            finally:
                self.reset_momenta()

    # -- batch-norm statistics for the averaged weights ----------------------------------------
    def reset_batch_norm_and_save_state(self, pl_module: nn.Module) -> None:
        """Zero the running statistics and make them a plain mean (``momentum=None``) for the pass to come."""
        self.momenta = {}
        for module in pl_module.modules():
            if isinstance(module, _BATCH_NORM) and module.track_running_stats:
                module.reset_running_stats()
                self.momenta[module] = module.momentum
                module.momentum = None

    def reset_momenta(self) -> None:
        for module, momentum in self.momenta.items():
            module.momentum = momentum

    @torch.no_grad()
    def _recompute_batch_norm(self, trainer, pl_module) -> None:
        """One pass of the training batches through ``training_step`` in train mode; its ``self.log`` calls go
        nowhere (the averaged model has no training step to report)."""
        loader = trainer.train_dataloader
        if loader is None:
            return
        limit = trainer.num_training_batches
        batches = data.batches_of(loader)
        if limit != math.inf:
            batches = itertools.islice(batches, int(limit))
        was_training = pl_module.training
        pl_module.train()
        pl_module.log, pl_module.log_dict = _no_log, _no_log  # instance attributes, removed below
        try:
            for batch_idx, batch in enumerate(batches):
                pl_module.training_step(pl_module._batch_on_device(batch), batch_idx)
        finally:
            del pl_module.log, pl_module.log_dict
            pl_module.train(was_training)

    # -- checkpoint ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "n_averaged": 0 if self.n_averaged is None else self.n_averaged.item(),
            "latest_update_epoch": self._latest_update_epoch,
            "scheduler_state": None if self._swa_scheduler is None else self._swa_scheduler.state_dict(),
            "average_model_state": None if self._average_model is None else self._average_model.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._init_n_averaged = state_dict["n_averaged"]
        self._latest_update_epoch = state_dict["latest_update_epoch"]
        self._scheduler_state = state_dict["scheduler_state"]
        if self._average_model is not None and state_dict["average_model_state"] is not None:
            self._average_model.load_state_dict(state_dict["average_model_state"])


_SWA_MEAN = get_swa_avg_fn()


def _no_log(*args: Any, **kwargs: Any) -> None:
    return None


__all__ = ["StochasticWeightAveraging"]
