"""One training batch with every hook, in Lightning's order: the general path of the fit loop.

The fit loop takes it when the module (or a callback, or the datamodule) overrides a
hook that changes the step (``optimizer_step``, ``optimizer_zero_grad``, ``backward``,
``configure_gradient_clipping``, the batch-transfer hooks...), see ``hooks.py``. The order
is Lightning's automatic optimization:

    on_before_batch_transfer -> transfer_batch_to_device -> on_after_batch_transfer
    on_train_batch_start
    optimizer_step(epoch, batch_idx, optimizer, closure)      # default: optimizer.step(closure=closure)
        closure: training_step -> [first batch of an accumulation window] on_before_zero_grad,
                 optimizer_zero_grad -> on_before_backward -> backward -> on_after_backward
        after the closure, before the update: on_before_optimizer_step -> configure_gradient_clipping
    on_train_batch_end({"loss": ..., ...})

On the accumulating batches of ``accumulate_grad_batches`` the closure runs alone (no
``optimizer_step``), under DDP's ``no_sync``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from gpulayer.trainer.loops.closure import Closure, ClosureResult, training_step_loss


def _loss_of(out: Any) -> torch.Tensor | None:
    """The loss in a ``training_step`` output (``None``: skip the step), see ``loops.closure``."""
    return training_step_loss(out)


def transfer_batch(hooks: Any, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
    """The batch through ``on_before_batch_transfer``, ``transfer_batch_to_device``, ``on_after_batch_transfer``."""
    before, to_device, after = hooks.transfer_fns
    batch = before(batch, dataloader_idx)
    batch = to_device(batch, device, dataloader_idx)
    return after(batch, dataloader_idx)


def optimizer_step(trainer: Any, optimizer: Any, closure: Any, **kwargs: Any) -> Any:
    """``LightningOptimizer.step``: the precision plugin steps ``optimizer`` with ``closure`` (LBFGS calls it).

    After the closure (step and backward) and before the update: ``on_before_optimizer_step``, then, under
    automatic optimization, ``configure_gradient_clipping`` with the Trainer's settings. Under manual
    optimization each step counts as one ``global_step``.
    """
    module = trainer.lightning_module
    out = trainer.precision_plugin.optimizer_step(optimizer, module, closure, **kwargs)
    if not module.automatic_optimization:
        trainer.global_step += 1
    return out


def backward(trainer: Any, loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The precision plugin's path: ``pre_backward`` (the loss scaled, ``on_before_backward``), ``backward``
    (``module.backward``), ``post_backward`` (``on_after_backward``)."""
    precision, module = trainer.precision_plugin, trainer.lightning_module
    loss = precision.pre_backward(loss, module)
    precision.backward(loss, module, optimizer, *args, **kwargs)
    precision.post_backward(loss, module)
    return loss


class _Closure(Closure):
    """training_step, zero_grad (on an accumulation window's first batch) and backward, for this batch."""

    def __init__(self, loop: Any, batch: Any, batch_idx: int):
        self.loop, self.batch, self.batch_idx = loop, batch, batch_idx
        zero_grad = self._zero_grad if batch_idx % loop.cfg.accumulate_grad_batches == 0 else None
        super().__init__(self._step, self._backward, zero_grad)

    def _step(self) -> ClosureResult:
        loop = self.loop
        with loop.precision.train_step_context():
            out = loop.step_fn(self.batch, self.batch_idx)
        if out is None and loop.trainer.world_size > 1:
            raise RuntimeError(
                "Skipping the `training_step` by returning None in distributed training is not supported. It is "
                "recommended that you rewrite your training logic to avoid having to skip the step in the first place.")
        return ClosureResult.from_training_step_output(out, loop.cfg.accumulate_grad_batches)

    def _backward(self, loss: torch.Tensor) -> None:
        self.loop.trainer.strategy.backward(loss, self.loop.optimizer)

    def _zero_grad(self) -> None:
        loop, opt = self.loop, self.loop.optimizer
        for f in loop.hooks.on_before_zero_grad:
            f(opt)
        loop.module.optimizer_zero_grad(loop.trainer.current_epoch, self.batch_idx, opt)


class GeneralStep:
    """``run(batch, batch_idx, stepping)`` -> what ``on_train_batch_end`` receives."""

    def __init__(self, loop: Any):
        self.loop = loop

    def run(self, batch: Any, batch_idx: int, stepping: bool) -> dict:
        loop, t = self.loop, self.loop.trainer
        closure = _Closure(loop, batch, batch_idx)
        if not stepping:
            sync = loop.strategy.no_sync() if t.world_size > 1 else contextlib.nullcontext()
            with sync:
                closure()
        else:
            lopt = t.lightning_optimizers[0] if t.lightning_optimizers else loop.optimizer
            loop.module.optimizer_step(t.current_epoch, batch_idx, lopt, closure)
        result = closure.consume_result()  # raises when optimizer_step never called the closure
        return {} if result.loss is None else result.asdict()
