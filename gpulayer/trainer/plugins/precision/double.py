"""``DoublePrecision`` (``64-true``): parameters, inputs and new tensors in float64."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
from torch import nn

from gpulayer.trainer.plugins.precision.precision import Precision, _deprecated
from gpulayer.trainer.plugins.precision.utils import _DtypeContextManager, convert_floats


class DoublePrecision(Precision):
    """Everything in float64: the module (``convert_module``), floating inputs, and the default dtype while a
    step or ``configure_model`` runs (so complex tensors made there are complex128 too)."""

    precision = "64-true"

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.double()

    def convert_input(self, data: Any) -> Any:
        return convert_floats(data, torch.double)

    def tensor_init_context(self) -> contextlib.AbstractContextManager:
        return _DtypeContextManager(torch.double)

    def module_init_context(self) -> contextlib.AbstractContextManager:
        return _DtypeContextManager(torch.double)

    def forward_context(self) -> contextlib.AbstractContextManager:
        return _DtypeContextManager(torch.double)


class DoublePrecisionPlugin(DoublePrecision):
    """Lightning's old name; use ``DoublePrecision``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _deprecated("DoublePrecisionPlugin", "DoublePrecision")
        super().__init__(*args, **kwargs)


class LightningDoublePrecisionModule(nn.Module):
    """Lightning's old wrapper that cast inputs to float64: no longer needed, ``DoublePrecision`` does it."""

    def __init__(self, pl_module: nn.Module) -> None:
        warnings.warn("The `LightningDoublePrecisionModule` is deprecated and no longer needed. Convert the inputs to "
                      "the `forward` method as you need (DoublePrecision.convert_input does it in the Trainer).",
                      DeprecationWarning, stacklevel=2)
        super().__init__()
        self.module = pl_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*convert_floats(args, torch.double), **convert_floats(kwargs, torch.double))
