"""``TrainingSpikeException``: what ``SpikeDetection`` raises (Lightning Fabric's ``utilities.spike`` path)."""

from __future__ import annotations

from typing import Any


class TrainingSpikeException(RuntimeError):
    """The loss of batch ``batch_idx`` spiked; the batches to skip on resume were written to a JSON file."""

    def __init__(self, batch_idx: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(f"Training spike detected in batch {batch_idx}", *args, **kwargs)
        self.batch_idx = batch_idx
