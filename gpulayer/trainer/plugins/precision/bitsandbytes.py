"""``BitsandbytesPrecision``: quantized linear layers through the ``bitsandbytes`` package (CUDA), when it is
installed. The plugin records the mode and dtype; converting modules needs the package."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from gpulayer.trainer.plugins.precision.precision import Precision, _deprecated

_BITSANDBYTES_AVAILABLE = importlib.util.find_spec("bitsandbytes") is not None
_MODES = ("nf4", "nf4-dq", "fp4", "fp4-dq", "int8", "int8-training")


class BitsandbytesPrecision(Precision):
    precision = "32-true"  # the plugin's own ``mode`` says how weights are kept

    def __init__(self, mode: str, dtype: torch.dtype | None = None, ignore_modules: Any = None) -> None:
        if not _BITSANDBYTES_AVAILABLE:
            raise ModuleNotFoundError("BitsandbytesPrecision needs the `bitsandbytes` package: "
                                      "pip install bitsandbytes")
        if mode not in _MODES:
            raise ValueError(f"BitsandbytesPrecision(mode={mode!r}) is not supported; one of {_MODES}")
        self.mode = mode
        self.dtype = dtype or torch.get_default_dtype()
        self.ignore_modules = set(ignore_modules or ())

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        raise NotImplementedError("gpulayer does not quantize modules with bitsandbytes yet; quantize the model "
                                  "before passing it to the Trainer")


class BitsandbytesPrecisionPlugin(BitsandbytesPrecision):
    """Lightning's old name; use ``BitsandbytesPrecision``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _deprecated("BitsandbytesPrecisionPlugin", "BitsandbytesPrecision")
        super().__init__(*args, **kwargs)
