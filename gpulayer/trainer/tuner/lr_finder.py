"""The learning-rate range test: train a few steps while the learning rate grows, watch the loss.

The learning rate goes from ``min_lr`` to ``max_lr`` over ``num_training`` optimizer steps
(exponentially or linearly); after each step the loss, smoothed by a running average, is
recorded. The search stops early when the smoothed loss exceeds ``early_stop_threshold``
times the best one seen (it diverged). ``LRFinder.suggestion()`` is the learning rate where
the smoothed loss falls fastest.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
from typing import Any, Iterator

import torch

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.errors import MisconfigurationException

log = logging.getLogger(__name__)

MODES = ("exponential", "linear")


@contextlib.contextmanager
def rng_kept() -> Iterator[None]:
    """The random states (Python's, torch's, numpy's when installed) as they were before: the range test draws
    batches and dropout masks the fit would otherwise draw."""
    py, cpu = random.getstate(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        import numpy as np
        np_state = np.random.get_state()
    except ImportError:
        np, np_state = None, None
    try:
        yield
    finally:
        random.setstate(py)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if np is not None:
            np.random.set_state(np_state)


def lr_schedule(mode: str, lr_min: float, lr_max: float, num_training: int) -> list[float]:
    """The learning rate of each step, ``lr_min`` first and ``lr_max`` last."""
    if mode not in MODES:
        raise MisconfigurationException(f"lr_find(mode={mode!r}) must be one of {MODES}")
    if num_training < 2:
        return [lr_min] * num_training
    fractions = [k / (num_training - 1) for k in range(num_training)]
    if mode == "linear":
        return [lr_min + f * (lr_max - lr_min) for f in fractions]
    return [lr_min * (lr_max / lr_min) ** f for f in fractions]


class LRFinder:
    """The search's outcome: ``results["lr"]`` and ``results["loss"]`` (smoothed), one entry per step."""

    def __init__(self, mode: str, lr_min: float, lr_max: float, num_training: int) -> None:
        self.mode, self.lr_min, self.lr_max, self.num_training = mode, lr_min, lr_max, num_training
        self.results: dict[str, list[float]] = {"lr": [], "loss": []}
        self._optimal_idx: int | None = None

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The learning rate at the steepest descent of the loss, ignoring the first ``skip_begin`` and the last
        ``skip_end`` points (and any that are not finite); None when fewer than two points remain."""
        lrs, losses = self.results["lr"], self.results["loss"]
        kept = [i for i in range(skip_begin, len(losses) - skip_end) if math.isfinite(losses[i])]
        if len(kept) < 2:
            log.error("Failed to compute suggestion for learning rate because there are not enough points. Increase "
                      "the loop iteration limits or the size of your dataset/dataloader.")
            self._optimal_idx = None
            return None
        slopes = torch.gradient(torch.tensor([losses[i] for i in kept]),
                                spacing=[torch.tensor([lrs[i] for i in kept])])[0]
        self._optimal_idx = kept[int(torch.argmin(slopes))]
        return lrs[self._optimal_idx]

    def plot(self, suggest: bool = False, show: bool = False, ax: Any = None) -> Any:
        """Loss against learning rate (log scale for the exponential search); needs matplotlib."""
        try:
            import matplotlib.pyplot as plt
        except ImportError as err:
            raise MisconfigurationException("To use the `plot` method, you must have Matplotlib installed. "
                                            "Install it by running `pip install -U matplotlib`.") from err
        fig = None
        if ax is None:
            fig, ax = plt.subplots()
        else:
            fig = ax.figure
        ax.plot(self.results["lr"], self.results["loss"])
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if suggest and self.suggestion() is not None:
            idx = self._optimal_idx
            ax.plot(self.results["lr"][idx], self.results["loss"][idx], markersize=10, marker="o", color="red")
        if show:
            plt.show()
        return fig


class LRSearch(Callback):
    """Drives one range test inside a trial fit: sets each step's learning rate, records the smoothed loss."""

    def __init__(self, lrs: list[float], early_stop_threshold: float | None, beta: float = 0.98) -> None:
        self.lrs_planned = lrs
        self.early_stop_threshold = early_stop_threshold
        self.beta = beta
        self.lrs: list[float] = []
        self.losses: list[float] = []
        self._avg = 0.0
        self._best = math.inf
        self._step = 0  # optimizer steps taken in this search
        self.batches = 0  # training batches seen (several per step when gradients accumulate)

    def on_fit_start(self, trainer, pl_module) -> None:
        # the range test sets each step's learning rate itself: the module's schedulers (a ReduceLROnPlateau
        # waiting for a validation metric this fit does not compute) take no part, as in Lightning
        trainer.lr_scheduler_configs = []

    def on_train_start(self, trainer, pl_module) -> None:
        if len(trainer.optimizers) != 1:
            raise MisconfigurationException(f"`model.configure_optimizers()` returned {len(trainer.optimizers)}, but "
                                            "learning rate finder only works with single optimizer")

    def _stepping(self, trainer, batch_idx: int) -> bool:
        return (batch_idx + 1) % trainer.accumulate_grad_batches == 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self._stepping(trainer, batch_idx) or self._step >= len(self.lrs_planned):
            return
        lr = self.lrs_planned[self._step]
        for group in trainer.optimizers[0].param_groups:
            group["lr"] = lr
        self.lrs.append(lr)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1
        if not self._stepping(trainer, batch_idx) or len(self.losses) >= len(self.lrs):
            return
        self._step += 1
        loss = outputs if isinstance(outputs, torch.Tensor) else (outputs or {}).get("loss")
        if loss is None:  # a skipped step: no point, but the lengths stay paired
            self.losses.append(float("nan"))
            return
        self._avg = self.beta * self._avg + (1 - self.beta) * float(loss)
        smoothed = self._avg / (1 - self.beta ** self._step)  # the running average without its start-up bias
        threshold = self.early_stop_threshold
        if threshold is not None and self._step > 1 and smoothed > threshold * self._best:
            trainer.should_stop = True  # diverged
        self._best = min(self._best, smoothed) if self._step > 1 else smoothed
        self.losses.append(smoothed)
