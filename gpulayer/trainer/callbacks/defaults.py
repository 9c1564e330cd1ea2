"""The callbacks a Trainer adds by itself, as Lightning does, beside the ones the user gives."""

from __future__ import annotations

from gpulayer.trainer.callbacks.model_checkpoint import ModelCheckpoint
from gpulayer.trainer.callbacks.model_summary import ModelSummary
from gpulayer.trainer.callbacks.progress.rich_progress import RichProgressBar
from gpulayer.trainer.callbacks.rich_model_summary import RichModelSummary


def add_default_summary(callbacks: list, enabled: bool) -> None:
    """``Trainer(enable_model_summary=True)``: a ``ModelSummary`` (a ``RichModelSummary`` under a
    ``RichProgressBar``) joins ``callbacks`` unless one is there, before the trailing checkpoint callbacks."""
    if not enabled or any(isinstance(c, ModelSummary) for c in callbacks):
        return
    if any(isinstance(c, RichProgressBar) for c in callbacks):
        summary: ModelSummary = RichModelSummary()
    else:
        summary = ModelSummary()
    tail = len(callbacks)
    while tail and isinstance(callbacks[tail - 1], ModelCheckpoint):
        tail -= 1
    callbacks.insert(tail, summary)
