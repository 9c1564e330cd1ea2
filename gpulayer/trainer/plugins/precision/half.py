"""``HalfPrecision`` (``16-true``, ``bf16-true``): parameters, inputs and new tensors in float16 or bfloat16,
no autocast and no loss scaling."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from gpulayer.trainer.plugins.precision.precision import Precision, _deprecated
from gpulayer.trainer.plugins.precision.utils import _DtypeContextManager, convert_floats


class HalfPrecision(Precision):
    def __init__(self, precision: str = "16-true") -> None:
        if precision not in ("16-true", "bf16-true"):
            raise ValueError(f"Passed `HalfPrecision(precision={precision!r})`. Precision must be '16-true' or "
                             "'bf16-true'.")
        self.precision = precision
        self._desired_input_dtype = torch.bfloat16 if precision == "bf16-true" else torch.float16

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self._desired_input_dtype)

    def convert_input(self, data: Any) -> Any:
        return convert_floats(data, self._desired_input_dtype)

    def tensor_init_context(self) -> contextlib.AbstractContextManager:
        return _DtypeContextManager(self._desired_input_dtype)

    def module_init_context(self) -> contextlib.AbstractContextManager:
        return _DtypeContextManager(self._desired_input_dtype)

    def forward_context(self) -> contextlib.AbstractContextManager:
        return _DtypeContextManager(self._desired_input_dtype)


class HalfPrecisionPlugin(HalfPrecision):
    """Lightning's old name; use ``HalfPrecision``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _deprecated("HalfPrecisionPlugin", "HalfPrecision")
        super().__init__(*args, **kwargs)
