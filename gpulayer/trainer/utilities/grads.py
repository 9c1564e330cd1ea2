"""``grad_norm``: the gradient norm of each parameter and of all of them together, ready to ``log_dict``."""

from __future__ import annotations

import torch
from torch import nn


def grad_norm(module: nn.Module, norm_type: float | int | str, group_separator: str = "/") -> dict[str, torch.Tensor]:
    """The ``norm_type``-norm of each parameter's gradient (parameters without one are left out) and of them all.

    Keys: ``grad_{p}_norm{group_separator}{parameter name}`` and ``grad_{p}_norm_total``, with ``p`` as a float
    (``2.0``, ``inf``). Each norm is computed in its gradient's dtype, so a float64 gradient does not overflow.

    >>> def on_before_optimizer_step(self, optimizer):   # doctest: +SKIP
    ...     self.log_dict(grad_norm(self.layer, norm_type=2))
    """
    norm_type = float(norm_type)
    if norm_type <= 0:
        raise ValueError(f"`norm_type` must be a positive number or 'inf' (infinity norm). Got {norm_type}")
    prefix = f"grad_{norm_type}_norm"
    norms = {f"{prefix}{group_separator}{name}": torch.linalg.vector_norm(p.grad.detach(), ord=norm_type)
             for name, p in module.named_parameters() if p.grad is not None}
    if norms:
        values = list(norms.values())
        dtype = _widest_dtype(values)
        norms[f"{prefix}_total"] = torch.linalg.vector_norm(torch.stack([v.to(dtype) for v in values]), ord=norm_type)
    return norms


def _widest_dtype(values: list[torch.Tensor]) -> torch.dtype:
    """The widest dtype among the per-parameter norms: the total is computed in it."""
    dtype = values[0].dtype
    for v in values[1:]:
        dtype = torch.promote_types(dtype, v.dtype)
    return dtype
