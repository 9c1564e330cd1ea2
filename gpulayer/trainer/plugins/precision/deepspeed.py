"""``DeepSpeedPrecision``: the precision names a DeepSpeed run takes. gpulayer has no DeepSpeed strategy; the plugin
keeps its dtype rules (``module_init_context``, ``convert_module``, ``convert_input``) for code that builds one."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from gpulayer.trainer.plugins.precision.precision import Precision, _deprecated
from gpulayer.trainer.plugins.precision.utils import _DtypeContextManager, convert_floats

_DTYPES = {"32-true": torch.float32, "16-true": torch.float16, "bf16-true": torch.bfloat16,
           "16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


class DeepSpeedPrecision(Precision):
    def __init__(self, precision: str) -> None:
        if precision not in _DTYPES:
            raise ValueError(f"`Trainer(strategy='deepspeed', precision={precision!r})` is not supported. `precision` "
                             f"must be one of: {tuple(_DTYPES)}.")
        self.precision = precision
        self._desired_dtype = _DTYPES[precision]

    @property
    def _true(self) -> bool:
        return self.precision in ("16-true", "bf16-true")

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self._desired_dtype) if self._true else module

    def convert_input(self, data: Any) -> Any:
        return convert_floats(data, self._desired_dtype)

    def tensor_init_context(self) -> contextlib.AbstractContextManager:
        return _DtypeContextManager(self._desired_dtype) if self._true else contextlib.nullcontext()

    def module_init_context(self) -> contextlib.AbstractContextManager:
        return self.tensor_init_context()


class DeepSpeedPrecisionPlugin(DeepSpeedPrecision):
    """Lightning's old name; use ``DeepSpeedPrecision``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _deprecated("DeepSpeedPrecisionPlugin", "DeepSpeedPrecision")
        super().__init__(*args, **kwargs)
