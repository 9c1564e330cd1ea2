"""When a Trainer's logged values reach its loggers: the loops call these at log intervals and epoch ends.

Steps are Lightning's: a fit's step values and epoch values go out at the count of optimizer steps taken
(``trainer.batches_stepped``, Lightning's ``_batches_that_stepped``) minus one, the step that ran; an
evaluation batch's ``on_step`` values at that loader's own batch count. Only global rank 0 writes.
"""

from __future__ import annotations

from typing import Any


def log_step_metrics(trainer: Any) -> None:
    """The training loop's latest step values (at a ``log_every_n_steps`` boundary)."""
    metrics = trainer.metric_store.step_metrics("train")
    if metrics:
        _send_at_own_step(trainer, metrics, trainer.batches_stepped - 1)


def log_epoch_metrics(trainer: Any, metrics: dict[str, float]) -> None:
    """A loop's epoch values at its end."""
    if metrics:
        # in a fit the counter already moved past the last step (Lightning logs at the step that ran);
        # a validate/test on its own logs at the count the trainer holds
        in_fit = trainer.loop is not None and trainer.state_stage == "fit"
        step = trainer.batches_stepped - 1 if in_fit else trainer.batches_stepped
        _send_at_own_step(trainer, metrics, max(step, 0))


def _send_at_own_step(trainer: Any, metrics: dict[str, float], step: int) -> None:
    """A value logged as ``"step"`` is the step these values go out at (Lightning's rule), else ``step`` with the
    epoch added."""
    if "step" in metrics:
        metrics = dict(metrics)
        send_to_loggers(trainer, metrics, int(metrics.pop("step")))
    else:
        send_to_loggers(trainer, {**metrics, "epoch": trainer.current_epoch}, step)


def log_eval_step_metrics(trainer: Any, acc_name: str) -> None:
    """An eval batch's ``on_step`` values, to the logger at that loader's batch count (Lightning's eval step)."""
    store = trainer.metric_store
    metrics = store.step_metrics(acc_name)
    step = store.next_eval_step(acc_name)
    if metrics:
        send_to_loggers(trainer, metrics, step)


def send_to_loggers(trainer: Any, metrics: dict[str, float], step: int) -> None:
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
