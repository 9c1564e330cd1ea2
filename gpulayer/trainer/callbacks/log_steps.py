"""When a callback that logs by itself logs, and at which step: Lightning's ``log_every_n_steps`` rule.

gpulayer's loop counts a batch's optimizer step (``trainer.batches_stepped``) before ``on_train_batch_end``;
Lightning counts it after, and its loggers see that earlier value. These helpers give Lightning's numbers.
"""

from __future__ import annotations

from typing import Any


def is_stepping_batch(trainer: Any, batch_idx: int) -> bool:
    """Batch ``batch_idx`` of the epoch ends an accumulation window (its optimizer step runs)."""
    return (batch_idx + 1) % trainer.accumulate_grad_batches == 0 or batch_idx + 1 == trainer.num_training_batches


def step_at_train_batch_end(trainer: Any, batch_idx: int) -> int:
    """The step a logger gets for what is logged in ``on_train_batch_end`` of ``batch_idx``."""
    stepped = trainer.batches_stepped
    return stepped - 1 if stepped > 0 and is_stepping_batch(trainer, batch_idx) else stepped


def train_log_due(trainer: Any, step: int) -> bool:
    """Training logs at ``step`` (a value of ``step_at_train_batch_end``, or ``batches_stepped`` before a batch)."""
    every = trainer.log_every_n_steps
    return bool(every) and ((step + 1) % every == 0 or bool(trainer.should_stop))


def eval_log_due(trainer: Any, batch_idx: int) -> bool:
    """An evaluation logs at its batch ``batch_idx`` of this run."""
    every = trainer.log_every_n_steps
    return bool(every) and ((batch_idx + 1) % every == 0 or bool(trainer.should_stop))
