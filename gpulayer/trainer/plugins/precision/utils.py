"""What the precision plugins share: a default-dtype context and the cast of a batch's floating tensors."""

from __future__ import annotations

from typing import Any

import torch

from gpulayer.trainer.prefetch import apply_to_tensors


class _DtypeContextManager:
    """``torch.set_default_dtype(new)`` inside, the previous default restored on exit (also on an error)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self._previous_dtype: torch.dtype = torch.get_default_dtype()
        self._new_dtype = dtype

    def __enter__(self) -> None:
        self._previous_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self._new_dtype)

    def __exit__(self, *exc: Any) -> None:
        torch.set_default_dtype(self._previous_dtype)


def convert_floats(data: Any, dtype: torch.dtype) -> Any:
    """``data`` with every floating-point tensor in ``dtype`` (integers, strings and the rest unchanged)."""
    return apply_to_tensors(data, lambda t: t.to(dtype) if torch.is_floating_point(t) else t)
