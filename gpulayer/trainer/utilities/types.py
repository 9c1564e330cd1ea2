"""Lightning's type names (``lightning.pytorch.utilities.types``) for annotations in ported code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from gpulayer.trainer.optimizers import SchedulerConfig

STEP_OUTPUT = Union[torch.Tensor, Mapping[str, Any], None]
EVAL_DATALOADERS = Any
TRAIN_DATALOADERS = Any
LRSchedulerTypeUnion = Union[LRScheduler, ReduceLROnPlateau]
LRSchedulerPLType = LRSchedulerTypeUnion
OptimizerLRScheduler = Any
LRSchedulerConfig = SchedulerConfig  # same fields, names and defaults as Lightning's dataclass

__all__ = ["EVAL_DATALOADERS", "LRSchedulerConfig", "LRSchedulerPLType", "LRSchedulerTypeUnion", "OptimizerLRScheduler",
           "STEP_OUTPUT", "TRAIN_DATALOADERS"]
