"""Precision plugins (Lightning's ``plugins.precision``) and the one rule that turns a Trainer's ``precision``
string into a plugin (``for_trainer``)."""

from __future__ import annotations

import warnings
from typing import Any

from gpulayer.trainer.plugins.precision.amp import MixedPrecision
from gpulayer.trainer.plugins.precision.bitsandbytes import BitsandbytesPrecision
from gpulayer.trainer.plugins.precision.deepspeed import DeepSpeedPrecision
from gpulayer.trainer.plugins.precision.double import DoublePrecision
from gpulayer.trainer.plugins.precision.fsdp import FSDPPrecision
from gpulayer.trainer.plugins.precision.half import HalfPrecision
from gpulayer.trainer.plugins.precision.precision import Precision
from gpulayer.trainer.plugins.precision.transformer_engine import TransformerEnginePrecision
from gpulayer.trainer.plugins.precision.xla import XLAPrecision


def for_trainer(precision: str, accelerator: str, sharded: bool = False) -> Precision:
    """The plugin a Trainer's (normalized) ``precision`` stands for on ``accelerator`` ("cpu" or "cuda")."""
    if sharded:
        return FSDPPrecision(precision)
    if precision in ("16-true", "bf16-true"):
        return HalfPrecision(precision)
    if precision == "64-true":
        return DoublePrecision()
    if precision == "16-mixed" and accelerator == "cpu":
        warnings.warn("You passed `Trainer(accelerator='cpu', precision='16-mixed')` but AMP with fp16 is not "
                      "supported on CPU. Using `precision='bf16-mixed'` instead.", UserWarning, stacklevel=3)
        precision = "bf16-mixed"
    if precision in ("16-mixed", "bf16-mixed"):
        return MixedPrecision(precision, "cpu" if accelerator == "cpu" else "cuda")
    return Precision()


def __getattr__(name: str) -> Any:
    """Lightning's old ``*PrecisionPlugin`` names (each warns that it is deprecated when built)."""
    from gpulayer.trainer.plugins.precision import amp, deepspeed, double, fsdp, half, precision, xla
    for mod in (amp, deepspeed, double, fsdp, half, precision, xla):
        if name.endswith("Plugin") and hasattr(mod, name):
            return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BitsandbytesPrecision", "DeepSpeedPrecision", "DoublePrecision", "FSDPPrecision", "HalfPrecision",
           "MixedPrecision", "Precision", "TransformerEnginePrecision", "XLAPrecision", "for_trainer"]
