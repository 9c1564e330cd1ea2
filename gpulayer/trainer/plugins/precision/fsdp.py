"""``FSDPPrecision``: the precision of an FSDP run, and the ``MixedPrecision`` config FSDP shards with.

``*-true``: parameters in the low dtype (converted, created under ``module_init_context``), steps under that
default dtype. ``*-mixed``: float32 parameters, steps under autocast, a ``ShardedGradScaler`` for ``16-mixed``.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
from torch import nn

from gpulayer.trainer.plugins.precision.amp import MixedPrecision
from gpulayer.trainer.plugins.precision.precision import Precision, _deprecated
from gpulayer.trainer.plugins.precision.utils import _DtypeContextManager, convert_floats

_DTYPES = {"16-true": torch.float16, "bf16-true": torch.bfloat16, "16-mixed": torch.float16,
           "bf16-mixed": torch.bfloat16, "32-true": torch.float32}


class FSDPPrecision(MixedPrecision):
    """``FSDPPrecision(precision, scaler=None)`` with ``precision`` one of ``32-true``, ``16-true``,
    ``bf16-true``, ``16-mixed``, ``bf16-mixed``."""

    def __init__(self, precision: str, scaler: Any = None) -> None:
        if precision not in _DTYPES:
            raise ValueError(f"`precision={precision!r})` is not supported in FSDP. `precision` must be one of: "
                             f"{tuple(_DTYPES)}.")
        if scaler is not None and precision != "16-mixed":
            raise ValueError(f"`precision={precision!r}` does not use a scaler, found {scaler}.")
        if scaler is None and precision == "16-mixed":
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
            scaler = ShardedGradScaler()
        self.precision = precision
        self.scaler = scaler
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self._dtype_of = _DTYPES[precision]

    @property
    def _dtype(self) -> torch.dtype:
        return self._dtype_of

    @property
    def _true(self) -> bool:
        return self.precision in ("16-true", "bf16-true")

    @property
    def mixed_precision_config(self) -> Any:
        """FSDP's ``MixedPrecision``: parameters, buffers and gradient reduction in the precision's dtype."""
        from torch.distributed.fsdp import MixedPrecision as TorchMixedPrecision
        if self._true:
            warnings.warn(f"FSDPPrecision `{self.precision}` enables computation in lower precision. FSDP will "
                          "always use float32 for its optimizer state; parameters are kept in the low dtype.",
                          UserWarning, stacklevel=2)
        dtype = self._dtype_of
        return TorchMixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype)

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self._dtype_of) if self._true else module

    def convert_input(self, data: Any) -> Any:
        return convert_floats(data, self._dtype_of) if self._true else data

    def tensor_init_context(self) -> contextlib.AbstractContextManager:
        return _DtypeContextManager(self._dtype_of) if self._true else contextlib.nullcontext()

    def module_init_context(self) -> contextlib.AbstractContextManager:
        return self.tensor_init_context()

    def forward_context(self) -> contextlib.AbstractContextManager:
        if self.precision in ("16-mixed", "bf16-mixed"):
            return self.autocast_context_manager()
        return _DtypeContextManager(self._dtype_of)

    def clip_grad_by_norm(self, optimizer: Any, clip_val: int | float) -> None:
        # FSDP clips through the sharded module (``FSDPStrategy``); here, the parameters the optimizer holds
        Precision.clip_grad_by_norm(self, optimizer, clip_val)


class FSDPPrecisionPlugin(FSDPPrecision):
    """Lightning's old name; use ``FSDPPrecision``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _deprecated("FSDPPrecisionPlugin", "FSDPPrecision")
        super().__init__(*args, **kwargs)


class FSDPMixedPrecisionPlugin(FSDPPrecision):
    """Lightning's old name; use ``FSDPPrecision``."""

    def __init__(self, precision: str, device: str, scaler: Any = None) -> None:
        _deprecated("FSDPMixedPrecisionPlugin", "FSDPPrecision")
        super().__init__(precision, scaler)
