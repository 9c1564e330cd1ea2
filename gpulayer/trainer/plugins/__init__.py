"""Lightning's ``plugins``: precision plugins (``precision/``) and checkpoint IO plugins (``io/``).

``Trainer(plugins=[...])`` takes at most one of each kind; a precision plugin replaces ``Trainer(precision=...)``,
a ``CheckpointIO`` replaces the strategy's default ``TorchCheckpointIO``::

    trainer = Trainer(plugins=[MixedPrecision("bf16-mixed", "cpu"), AsyncCheckpointIO()])
"""

from __future__ import annotations

from typing import Any, Union

from gpulayer.trainer.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO
from gpulayer.trainer.plugins.precision import (
    BitsandbytesPrecision, DeepSpeedPrecision, DoublePrecision, FSDPPrecision, HalfPrecision, MixedPrecision,
    Precision, TransformerEnginePrecision, XLAPrecision)

_PLUGIN_INPUT = Union[Precision, CheckpointIO]


def __getattr__(name: str) -> Any:
    """Lightning's old ``*PrecisionPlugin`` names."""
    from gpulayer.trainer.plugins import precision
    return getattr(precision, name)


__all__ = ["AsyncCheckpointIO", "BitsandbytesPrecision", "CheckpointIO", "DeepSpeedPrecision", "DoublePrecision",
           "FSDPPrecision", "HalfPrecision", "MixedPrecision", "Precision", "TorchCheckpointIO",
           "TransformerEnginePrecision", "XLAPrecision"]
