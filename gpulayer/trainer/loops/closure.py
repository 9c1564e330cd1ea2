"""The closure automatic optimization hands to ``optimizer.step`` (Lightning's ``Closure``).

Calling it runs the training step, zeroes the gradients (when given a way to) and runs
backward on the loss, then returns the loss detached: what ``optimizer.step(closure)``
expects, so an optimizer that re-evaluates the loss (LBFGS) works unchanged. The fit
loop's general path (``stepping.py``) builds one per batch; the fast path does the same
work inline and shares the warning it gives when the step returns ``None``.

    closure = Closure(step_fn, backward_fn=loss_backward, zero_grad_fn=optimizer.zero_grad)
    optimizer.step(closure)
    result = closure.consume_result()      # ClosureResult: closure_loss, loss, extra
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import torch

from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.utilities.rank_zero import WarningCache

NONE_RETURNED = "`training_step` returned `None`. If this was on purpose, ignore this warning..."


def training_step_loss(out: Any) -> torch.Tensor | None:
    """The loss in what ``training_step`` returned (a tensor, a dict with ``"loss"``, or ``None``: skip the step)."""
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


@dataclasses.dataclass
class ClosureResult:
    """One closure call: the loss backward ran on (``closure_loss``), a detached copy (``loss``), the other keys."""

    closure_loss: torch.Tensor | None
    loss: torch.Tensor | None = dataclasses.field(init=False, default=None)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.closure_loss is not None:  # a copy: the precision plugin may scale the closure loss in place
            self.loss = self.closure_loss.detach().clone()

    @classmethod
    def from_training_step_output(cls, out: Any, normalize: int = 1) -> ClosureResult:
        """``normalize``: ``accumulate_grad_batches`` (the loss is divided by it, not in place)."""
        loss = training_step_loss(out)
        extra = {k: v for k, v in out.items() if k != "loss"} if isinstance(out, Mapping) else {}
        if loss is not None and normalize != 1:
            loss = loss / normalize
        return cls(loss, extra=extra)

    def asdict(self) -> dict[str, Any]:
        """What ``on_train_batch_end`` receives as ``outputs``."""
        return {"loss": self.loss, **self.extra}


class Closure:
    """``training_step`` + zero_grad + backward as one callable for ``optimizer.step(closure)``.

    ``step_fn()`` returns a ``ClosureResult``; ``backward_fn(loss)`` and ``zero_grad_fn()`` may be None (skipped).
    """

    warning_cache = WarningCache()

    def __init__(self, step_fn: Callable[[], ClosureResult], backward_fn: Callable[[torch.Tensor], Any] | None = None,
                 zero_grad_fn: Callable[[], Any] | None = None):
        self._step_fn, self._backward_fn, self._zero_grad_fn = step_fn, backward_fn, zero_grad_fn
        self._result: ClosureResult | None = None

    @torch.enable_grad()
    def closure(self, *args: Any, **kwargs: Any) -> ClosureResult:
        result = self._step_fn()
        if result.closure_loss is None:
            self.warning_cache.warn(NONE_RETURNED)
        if self._zero_grad_fn is not None:
            self._zero_grad_fn()
        if self._backward_fn is not None and result.closure_loss is not None:
            self._backward_fn(result.closure_loss)
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        self._result = self.closure(*args, **kwargs)
        return self._result.loss

    def consume_result(self) -> ClosureResult:
        """The last call's result, handed over once (the closure drops its reference)."""
        if self._result is None:
            raise MisconfigurationException(
                "The closure hasn't been executed. HINT: did you call `optimizer_closure()` in your `optimizer_step` "
                "hook? It could also happen because the `optimizer.step(optimizer_closure)` call did not execute it "
                "internally.")
        result, self._result = self._result, None
        return result
