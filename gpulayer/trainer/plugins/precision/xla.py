"""``XLAPrecision``: the precision names of a TPU run. gpulayer runs no XLA strategy; the plugin keeps the names."""

from __future__ import annotations

from typing import Any

from gpulayer.trainer.plugins.precision.precision import Precision, _deprecated

_PRECISIONS = ("32-true", "16-true", "bf16-true")


class XLAPrecision(Precision):
    def __init__(self, precision: str = "32-true") -> None:
        if precision not in _PRECISIONS:
            raise ValueError(f"`precision={precision!r})` is not supported in XLA. `precision` must be one of: "
                             f"{_PRECISIONS}.")
        self.precision = precision


class XLAPrecisionPlugin(XLAPrecision):
    """Lightning's old name; use ``XLAPrecision``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _deprecated("XLAPrecisionPlugin", "XLAPrecision")
        super().__init__(*args, **kwargs)
