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
import warnings
from typing import Any, Mapping

import torch

from gpulayer.trainer.errors import MisconfigurationException


def _loss_of(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor) or out is None:
        return out
    if isinstance(out, Mapping):
        if out.get("loss") is None:
            raise MisconfigurationException(
                "In automatic_optimization, when `training_step` returns a dict, the 'loss' key needs to be present")
        return out["loss"]
    raise MisconfigurationException(
        "In automatic optimization, `training_step` must return a Tensor, a dict, or None (where the step will be "
        f"skipped); it returned {type(out).__name__}")



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
    module, cfg = trainer.lightning_module, trainer._config

    def after_closure() -> None:
        for f in trainer._hooks.on_before_optimizer_step:
            f(optimizer)
        if module.automatic_optimization:
            module.configure_gradient_clipping(optimizer, gradient_clip_val=cfg.gradient_clip_val,
                                               gradient_clip_algorithm=cfg.gradient_clip_algorithm)

    out = trainer._precision.optimizer_step(optimizer, closure, after_closure, **kwargs)
    if not module.automatic_optimization:
        trainer.global_step += 1
    return out


def backward(trainer: Any, loss: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``on_before_backward`` -> ``module.backward`` on the loss the precision scaled -> ``on_after_backward``."""
    hooks = trainer._hooks
    loss = trainer._precision.scale_loss(loss)
    for f in hooks.on_before_backward:
        f(loss)
    trainer.lightning_module.backward(loss, *args, **kwargs)
    for f in hooks.on_after_backward:
        f()
    return loss


class _Closure:
    """training_step, zero_grad (when due) and backward; called by the optimizer (maybe several times: LBFGS)."""

    def __init__(self, loop: Any, batch: Any, batch_idx: int):
        self.loop, self.batch, self.batch_idx = loop, batch, batch_idx
        self.out: Any = None
        self.loss: torch.Tensor | None = None
        self.ran = False

    @torch.enable_grad()
    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        loop, t = self.loop, self.loop.trainer
        with loop.precision.forward_context():
            out = loop.step_fn(self.batch, self.batch_idx)
        loss = _loss_of(out)
        if loss is None and t.world_size > 1:
            raise RuntimeError(
                "Skipping the `training_step` by returning None in distributed training is not supported. It is "
                "recommended that you rewrite your training logic to avoid having to skip the step in the first place.")
        accum = loop.cfg.accumulate_grad_batches
        if loss is None:
            _warn_once("`training_step` returned `None`. If this was on purpose, ignore this warning...")
        elif accum > 1:
            loss = loss / accum
        self.out, self.loss, self.ran = out, loss, True
        if self.batch_idx % accum == 0:  # the first batch of an accumulation window starts from zero gradients
            opt = loop.optimizer
            for f in loop.hooks.on_before_zero_grad:
                f(opt)
            loop.module.optimizer_zero_grad(t.current_epoch, self.batch_idx, opt)
        if loss is None:
            return None
        t._backward(loss, optimizer=loop.optimizer)
        return loss.detach()


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, UserWarning, stacklevel=3)


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
            lopt = t._lightning_optimizers[0] if t._lightning_optimizers else loop.optimizer
            loop.module.optimizer_step(t.current_epoch, batch_idx, lopt, closure)
        if not closure.ran:
            raise MisconfigurationException(
                "The closure hasn't been executed. HINT: did you call `optimizer_closure()` in your `optimizer_step` "
                "hook? It could also happen because the `optimizer.step(optimizer_closure)` call did not execute it "
                "internally.")
        if closure.loss is None:
            return {}
        out = closure.out
        extra = {k: v for k, v in out.items() if k != "loss"} if isinstance(out, dict) else {}
        return {"loss": closure.loss.detach().clone(), **extra}
