"""Precision plugins: how the forward runs (autocast) and how gradients reach the optimizer.

``32-true``: plain. ``bf16-mixed``: autocast to bfloat16 (CPU and CUDA), no scaler.
``16-mixed``: autocast to float16 with a ``GradScaler`` (CUDA); gradients are
unscaled before clipping so the clip threshold means what it says.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch import nn

from gpulayer.trainer.errors import MisconfigurationException


def _always() -> bool:
    return True


class Precision:
    """Full precision: forward as written, ``loss.backward()``, ``optimizer.step()``."""

    name = "32-true"

    def __init__(self, device_type: str = "cpu"):
        self.device_type = device_type
        self._null = contextlib.nullcontext()
        self._automatic: Callable[[], bool] = _always  # the Trainer points it at the module's flag

    def forward_context(self):
        return self._null

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``.grad`` hold true gradients (before clipping or inspection)."""

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    # -- the path of Lightning's hooks: LightningOptimizer.step(closure) ends here ------------------
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The tensor ``backward`` runs on (what ``on_before_backward`` sees, as in Lightning)."""
        return loss

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], after_closure: Callable[[], None],
                       **kwargs: Any) -> Any:
        """``optimizer.step(closure=...)``; the closure runs the step and backward, then ``after_closure``.

        ``after_closure`` (``on_before_optimizer_step`` and gradient clipping) sees the gradients of this
        step before the optimizer uses them; LBFGS and other closure-calling optimizers work unchanged.
        """
        def wrapped() -> Any:
            result = closure()
            after_closure()
            return result
        return optimizer.step(closure=wrapped, **kwargs)

    def clip_gradients(self, optimizer: Any, value: float, algorithm: str) -> None:
        """Clip ``optimizer``'s gradients as they are now (the loss scaler, if any, already unscaled them)."""
        if value <= 0:
            return
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, value)
        else:
            torch.nn.utils.clip_grad_norm_(params, value)

    def clip(self, optimizer: torch.optim.Optimizer, params: list[nn.Parameter], value: float, algorithm: str) -> None:
        self.unscale(optimizer)
        if algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, value)
        else:  # "norm", or None: the Trainer's default
            torch.nn.utils.clip_grad_norm_(params, value)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class MixedPrecision(Precision):
    """Autocast to ``dtype``; with float16 a ``GradScaler`` guards against underflow."""

    def __init__(self, device_type: str, dtype: torch.dtype):
        super().__init__(device_type)
        self.dtype = dtype
        self.name = "bf16-mixed" if dtype == torch.bfloat16 else "16-mixed"
        self.scaler = torch.amp.GradScaler(device_type) if dtype == torch.float16 else None
        self._unscaled: set[int] = set()
        # built once and re-entered every step, as nanoGPT does (the loop never nests it)
        self._autocast = torch.autocast(device_type, dtype=dtype)

    def forward_context(self):
        return self._autocast

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            optimizer.step()
        else:
            self.scaler.step(optimizer)
            self.scaler.update()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss if self.scaler is None else self.scaler.scale(loss)

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], after_closure: Callable[[], None],
                       **kwargs: Any) -> Any:
        """With a loss scaler: closure, unscale, ``after_closure``, then the scaler's step (skipped on inf/NaN)."""
        if self.scaler is None:
            return super().optimizer_step(optimizer, closure, after_closure, **kwargs)
        if isinstance(optimizer, torch.optim.LBFGS):
            raise MisconfigurationException("AMP and the LBFGS optimizer are not compatible.")
        result = closure()
        # a training_step that returned None (automatic optimization) skips the step entirely
        skipped = result is None and self._automatic()
        if not skipped and not getattr(optimizer, "_step_supports_amp_scaling", False):
            self.scaler.unscale_(optimizer)
        after_closure()
        if skipped:
            return result
        out = self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        return out

    def clip_gradients(self, optimizer: Any, value: float, algorithm: str) -> None:
        if value > 0 and getattr(optimizer, "_step_supports_amp_scaling", False):
            raise RuntimeError(
                f"The current optimizer, {type(optimizer).__qualname__}, does not allow for gradient clipping because it "
                "performs unscaling of gradients internally. HINT: Are you using a 'fused' optimizer?")
        super().clip_gradients(optimizer, value, algorithm)

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def make_precision(precision: str, device_type: str) -> Precision:
    if precision == "bf16-mixed":
        return MixedPrecision(device_type, torch.bfloat16)
    if precision == "16-mixed":
        return MixedPrecision(device_type, torch.float16)
    return Precision(device_type)
