"""``TransformerEnginePrecision``: NVIDIA Transformer Engine's FP8 layers, when the package is installed. The plugin
records the weights dtype and recipe; converting modules needs the package."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from gpulayer.trainer.plugins.precision.precision import Precision, _deprecated

_TRANSFORMER_ENGINE_AVAILABLE = importlib.util.find_spec("transformer_engine") is not None


class TransformerEnginePrecision(Precision):
    precision = "transformer-engine"

    def __init__(self, *, weights_dtype: torch.dtype, recipe: Any = None, replace_layers: bool | None = None,
                 fallback_compute_dtype: torch.dtype | None = None) -> None:
        if not _TRANSFORMER_ENGINE_AVAILABLE:
            raise ModuleNotFoundError("TransformerEnginePrecision needs the `transformer_engine` package: "
                                      "pip install transformer-engine")
        self.weights_dtype = weights_dtype
        self.recipe = recipe
        self.replace_layers = replace_layers
        self.fallback_compute_dtype = fallback_compute_dtype or weights_dtype


class TransformerEnginePrecisionPlugin(TransformerEnginePrecision):
    """Lightning's old name; use ``TransformerEnginePrecision``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _deprecated("TransformerEnginePrecisionPlugin", "TransformerEnginePrecision")
        super().__init__(*args, **kwargs)
