"""``MixedPrecision``: the step under ``torch.autocast``; with float16 a ``GradScaler`` guards against underflow.

``bf16-mixed`` needs no scaler. ``16-mixed`` scales the loss before backward and unscales the gradients after the
closure, before ``on_before_optimizer_step`` and clipping, so the hooks and the clip threshold see true gradients; a
step whose gradients hold inf/NaN is skipped by the scaler.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.plugins.precision.precision import Precision, _deprecated
from gpulayer.trainer.utilities.enums import GradClipAlgorithmType


def _handles_unscaling(optimizer: Any) -> bool:
    """A fused optimizer unscales inside its own step (``_step_supports_amp_scaling``)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


class MixedPrecision(Precision):
    """``MixedPrecision("16-mixed" | "bf16-mixed", device, scaler=None)``; ``device`` is ``"cpu"`` or ``"cuda"``."""

    def __init__(self, precision: str, device: str, scaler: Any = None) -> None:
        if precision not in ("16-mixed", "bf16-mixed"):
            raise ValueError(f"Passed `{type(self).__name__}(precision={precision!r})`. Precision must be '16-mixed' "
                             "or 'bf16-mixed'.")
        self.precision = precision
        if scaler is None and precision == "16-mixed":
            scaler = torch.amp.GradScaler(device=str(device).split(":")[0])
        if scaler is not None and precision == "bf16-mixed":
            raise MisconfigurationException(f"`precision='bf16-mixed'` does not use a scaler, found {scaler}.")
        self.device = device
        self.scaler = scaler

    @property
    def _dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.precision == "bf16-mixed" else torch.half

    def autocast_context_manager(self) -> torch.autocast:
        return torch.autocast(str(self.device).split(":")[0], dtype=self._dtype, cache_enabled=False)

    def forward_context(self) -> contextlib.AbstractContextManager:
        return self.autocast_context_manager()

    def pre_backward(self, tensor: torch.Tensor, module: Any) -> torch.Tensor:
        if self.scaler is not None:
            tensor = self.scaler.scale(tensor)
        return super().pre_backward(tensor, module)

    def optimizer_step(self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        if self.scaler is None:  # bf16: nothing to unscale
            return super().optimizer_step(optimizer, model, closure, **kwargs)
        if isinstance(optimizer, torch.optim.LBFGS):
            raise MisconfigurationException("AMP and the LBFGS optimizer are not compatible.")
        result = closure()  # the scaler cannot step with a closure: run it first
        if not _handles_unscaling(optimizer):
            self.scaler.unscale_(optimizer)  # hooks and clipping see true gradients
        self._after_closure(model, optimizer)
        # a training_step that returned None (automatic optimization) skips the step, and the scaler with it
        automatic = getattr(model, "automatic_optimization", True) is True
        if result is None and automatic:
            return result
        out = self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        return out

    def clip_gradients(self, optimizer: Any, clip_val: int | float = 0.0,
                       gradient_clip_algorithm: GradClipAlgorithmType | str = GradClipAlgorithmType.NORM) -> None:
        if clip_val > 0 and _handles_unscaling(optimizer):
            raise RuntimeError(
                f"The current optimizer, {type(optimizer).__qualname__}, does not allow for gradient clipping because it "
                "performs unscaling of gradients internally. HINT: Are you using a 'fused' optimizer?")
        super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)

    # the fast loop's path
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss if self.scaler is None else self.scaler.scale(loss)

    def unscale(self, optimizer: Any) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: Any) -> None:
        if self.scaler is None:
            optimizer.step()
        else:
            self.scaler.step(optimizer)
            self.scaler.update()

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.scaler is not None and state_dict:
            self.scaler.load_state_dict(state_dict)


class MixedPrecisionPlugin(MixedPrecision):
    """Lightning's old name; use ``MixedPrecision``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _deprecated("MixedPrecisionPlugin", "MixedPrecision")
        super().__init__(*args, **kwargs)
