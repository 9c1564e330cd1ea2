"""``SpikeDetection``: stop training when the loss jumps far above its running mean.

Each rank compares its own loss with the mean of its last ``window`` finite losses; when any rank sees a spike
every rank raises ``TrainingSpikeException``, after global rank 0 wrote the batch and the one before it (which
may have corrupted the weights) to ``exclude_batches_path`` (a JSON list), for a resume that skips them.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Mapping
from typing import Any, Literal

import torch

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.utilities.spike import TrainingSpikeException


class SpikeDetection(Callback):
    """Raise ``TrainingSpikeException`` at a loss spike.

    ``mode``: ``"min"`` (a loss) or ``"max"``; a change in that direction is never a spike. ``window``: how many
    of the last finite values the running mean takes. ``warmup``: batches before checking starts. A value is a
    spike when it is farther than ``atol`` from the mean and farther than ``rtol`` times the mean (``None``
    leaves a test out). ``finite_only=True``: NaN and inf are spikes; ``False``: they are ignored.
    ``exclude_batches_path``: a ``.json`` file or a directory for ``skip_batches.json`` (default: the
    Trainer's ``default_root_dir``).
    """

    def __init__(self, mode: Literal["min", "max"] = "min", window: int = 10, warmup: int = 1,
                 atol: float | None = None, rtol: float | None = 2.0, exclude_batches_path: str | None = None,
                 finite_only: bool = True) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"Invalid mode. Has to be min or max, found {mode}")
        self.mode = mode
        self.window = window
        self.warmup = warmup
        self.atol = atol
        self.rtol = rtol
        self.exclude_batches_path = exclude_batches_path
        self.finite_only = finite_only
        self.last_val: float = 0.0
        self.bad_batches: list[int] = []
        self._recent: deque[float] = deque(maxlen=window)

    @torch.no_grad()
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if isinstance(outputs, torch.Tensor):
            loss = outputs.detach()
        elif isinstance(outputs, Mapping):
            loss = outputs["loss"].detach()
        else:
            raise TypeError(f"outputs have to be of type torch.Tensor or Mapping, got {type(outputs).__qualname__}")
        value = float(loss.float().mean())  # one sync per batch: the decision needs the value on the host
        spike = batch_idx >= self.warmup and self._is_spike(value)
        strategy = trainer.strategy
        if _any_rank(strategy, spike):
            self._handle_spike(trainer, batch_idx)
        elif self.finite_only or _all_ranks(strategy, math.isfinite(value)):
            self._recent.append(value)
            self.last_val = value

    def _is_spike(self, value: float) -> bool:
        if not math.isfinite(value):
            if self.finite_only:
                return True
            if math.isnan(value):
                return False  # NaN compares false with everything: never a spike when non-finite values are kept
        if (value <= self.last_val) if self.mode == "min" else (value >= self.last_val):
            return False
        mean = sum(self._recent) / len(self._recent) if self._recent else math.nan
        far_abs = self.atol is None or abs(value - mean) >= abs(self.atol)
        far_rel = self.rtol is None or abs(value - mean) >= abs(self.rtol * mean)
        return far_abs and far_rel

    def _handle_spike(self, trainer: Any, batch_idx: int) -> None:
        self.bad_batches.extend([batch_idx - 1, batch_idx])
        path = str(self.exclude_batches_path or trainer.default_root_dir)
        if not path.endswith(".json"):
            path = os.path.join(path, "skip_batches.json")
        self.exclude_batches_path = path
        if trainer.is_global_zero:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                json.dump(self.bad_batches, f, indent=4)
        raise TrainingSpikeException(batch_idx=batch_idx)

    def state_dict(self) -> dict[str, Any]:
        return {"last_val": self.last_val, "mode": self.mode, "warmup": self.warmup, "atol": self.atol,
                "rtol": self.rtol, "bad_batches": list(self.bad_batches), "bad_batches_path": self.exclude_batches_path,
                "window": self.window, "recent": list(self._recent)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_val = state_dict["last_val"]
        self.mode, self.warmup = state_dict["mode"], state_dict["warmup"]
        self.atol, self.rtol = state_dict["atol"], state_dict["rtol"]
        self.bad_batches = list(state_dict["bad_batches"])
        self.exclude_batches_path = state_dict["bad_batches_path"]
        self.window = state_dict.get("window", self.window)
        self._recent = deque(state_dict.get("recent", []), maxlen=self.window)


def _any_rank(strategy: Any, flag: bool) -> bool:
    """``flag`` is true on some rank (one all-reduce in a multi-process fit)."""
    if hasattr(strategy, "reduce_boolean_decision"):
        return bool(strategy.reduce_boolean_decision(flag, all=False))
    return bool(strategy.any(flag))


def _all_ranks(strategy: Any, flag: bool) -> bool:
    if hasattr(strategy, "reduce_boolean_decision"):
        return bool(strategy.reduce_boolean_decision(flag, all=True))
    return bool(strategy.all(flag))
