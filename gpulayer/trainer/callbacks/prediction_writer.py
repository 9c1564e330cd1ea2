"""``BasePredictionWriter`` (Lightning's ``callbacks.prediction_writer``): write predictions as they come.

Subclass it and override ``write_on_batch_end`` (called after each predict batch) and/or
``write_on_epoch_end`` (called once, with every batch's prediction), chosen by ``write_interval``:
``"batch"``, ``"epoch"`` or ``"batch_and_epoch"``. With ``trainer.predict(..., return_predictions=False)``
nothing is kept for the return value, yet an epoch writer still gets every prediction. The sample
indices of each batch come along (``batch_indices``), so a writer on several ranks can put the
outputs back in dataset order; a loader whose indices cannot be known (an ``IterableDataset``,
a ``DataLoader`` subclass) gives empty lists.

>>> class SaveAll(BasePredictionWriter):
...     def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
...         torch.save(predictions, f"predictions_{trainer.global_rank}.pt")
>>> trainer = Trainer(callbacks=[SaveAll(write_interval="epoch")])   # doctest: +SKIP
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from enum import Enum
from typing import Any, Literal

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.errors import MisconfigurationException



class WriteInterval(str, Enum):
    """When a writer writes: after each batch, once at the epoch end, or both."""

    BATCH = "batch"
    EPOCH = "epoch"
    BATCH_AND_EPOCH = "batch_and_epoch"

    @property
    def on_batch(self) -> bool:
        return self in (WriteInterval.BATCH, WriteInterval.BATCH_AND_EPOCH)

    @property
    def on_epoch(self) -> bool:
        return self in (WriteInterval.EPOCH, WriteInterval.BATCH_AND_EPOCH)


class BasePredictionWriter(Callback):
    """Base class of callbacks that store predictions; see the module's docstring."""

    def __init__(self, write_interval: Literal["batch", "epoch", "batch_and_epoch"] = "batch") -> None:
        if write_interval not in [i.value for i in WriteInterval]:
            raise MisconfigurationException(f"`write_interval` should be one of {[i.value for i in WriteInterval]}.")
        self.interval = WriteInterval(write_interval)

    def setup(self, trainer, pl_module, stage: str) -> None:
        step = getattr(pl_module, "predict_step", None)
        try:
            params = inspect.signature(step).parameters if callable(step) else {}
        except (TypeError, ValueError):
            params = {}
        if "dataloader_iter" in params:
            raise NotImplementedError("The `PredictionWriterCallback` does not support using `dataloader_iter`.")

    def write_on_batch_end(self, trainer, pl_module, prediction: Any, batch_indices: Sequence[int] | None, batch: Any,
                           batch_idx: int, dataloader_idx: int) -> None:
        """Override: write one batch's ``prediction`` (its samples are ``batch_indices`` of the dataset)."""
        raise NotImplementedError(f"{type(self).__name__} must override write_on_batch_end for "
                                  f"write_interval={self.interval.value!r}")

    def write_on_epoch_end(self, trainer, pl_module, predictions: Sequence[Any], batch_indices: Sequence[Any]) -> None:
        """Override: write every prediction (a list per loader when there are several; ``batch_indices`` always
        has one list per loader)."""
        raise NotImplementedError(f"{type(self).__name__} must override write_on_epoch_end for "
                                  f"write_interval={self.interval.value!r}")

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self.interval.on_batch:
            indices = trainer.predict_loop.current_batch_indices
            self.write_on_batch_end(trainer, pl_module, outputs, indices, batch, batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer, pl_module) -> None:
        if self.interval.on_epoch:
            loop = trainer.predict_loop
            self.write_on_epoch_end(trainer, pl_module, loop.predictions, loop.epoch_batch_indices)


__all__ = ["BasePredictionWriter", "WriteInterval"]
