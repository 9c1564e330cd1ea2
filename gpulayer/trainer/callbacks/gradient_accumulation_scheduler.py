"""``GradientAccumulationScheduler`` (Lightning's ``callbacks.gradient_accumulation_scheduler``): how many
batches to accumulate, changing with the epoch.

``GradientAccumulationScheduler(scheduling={0: 4, 5: 2, 10: 1})`` accumulates 4 batches per optimizer step
in epochs 0-4, 2 in epochs 5-9, then steps every batch. Epochs before the first key accumulate nothing
(factor 1). At each train epoch start it sets ``trainer.accumulate_grad_batches``, which the fit loop reads
for that epoch; so the Trainer's own ``accumulate_grad_batches`` must stay 1, and the module must use
automatic optimization.
"""

from __future__ import annotations

from typing import Any

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.utilities.model_helpers import is_overridden
from gpulayer.trainer.utilities.rank_zero import rank_zero_warn


class GradientAccumulationScheduler(Callback):
    """Accumulate ``scheduling[e]`` batches per step from epoch ``e`` on (epochs count from 0).

    >>> GradientAccumulationScheduler(scheduling={4: 2}).get_accumulate_grad_batches(5)
    2
    """

    def __init__(self, scheduling: dict[int, int]):
        if not scheduling:
            raise TypeError("Empty dict cannot be interpreted correct")
        if any(not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0 for epoch in scheduling):
            raise MisconfigurationException(
                f"Epoch should be an int greater than or equal to 0. Got {list(scheduling.keys())}.")
        if any(not isinstance(factor, int) or isinstance(factor, bool) or factor < 1 for factor in scheduling.values()):
            raise MisconfigurationException(
                f"Accumulation factor should be an int greater than 0. Got {list(scheduling.values())}.")
        if 0 not in scheduling:  # before the first scheduled epoch: one batch per step
            scheduling.update({0: 1})
        self.scheduling = scheduling
        self.epochs = sorted(scheduling)

    def going_to_accumulate_grad_batches(self) -> bool:
        """Some epoch accumulates more than one batch."""
        return any(factor > 1 for factor in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """The factor of ``epoch``: that of the last scheduled epoch at or before it."""
        started = [e for e in self.epochs if e <= epoch]
        return self.scheduling[started[-1]] if started else 1

    def on_train_start(self, trainer, pl_module) -> None:
        if not pl_module.automatic_optimization:
            raise RuntimeError(
                "Automatic gradient accumulation and the `GradientAccumulationScheduler` is not supported for manual "
                "optimization. Please remove the callback or switch to automatic optimization.")
        custom_step = is_overridden("optimizer_step", pl_module) or is_overridden("optimizer_zero_grad", pl_module)
        if custom_step and self.going_to_accumulate_grad_batches():
            rank_zero_warn(
                "When using `Trainer(accumulate_grad_batches != 1)` and overriding "
                "`LightningModule.optimizer_{step,zero_grad}`, the hooks will not be called on every batch (rather, "
                "they are called on every optimization step).")
        if trainer.accumulate_grad_batches != 1:
            raise ValueError(
                "You have set `accumulate_grad_batches` and are using the `GradientAccumulationScheduler` callback. "
                "Either remove `accumulate_grad_batches` from the Trainer or remove the callback.")

    def on_train_epoch_start(self, trainer, *_: Any) -> None:
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)


__all__ = ["GradientAccumulationScheduler"]
