"""``LightningOptimizer`` (Lightning's ``core.optimizer``): what ``self.optimizers()`` hands a module.

It wraps the optimizer ``configure_optimizers`` returned and routes ``step`` through
the Trainer: the closure runs, ``on_before_optimizer_step`` hooks fire, the
precision plugin steps (the loss scaler, if any), and under manual optimization
each step counts as one ``global_step``, as in Lightning. Everything else is the
wrapped optimizer's (``param_groups``, ``zero_grad``, ``state_dict``...), and
``isinstance(opt, torch.optim.SGD)`` still holds.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from gpulayer.trainer import stepping
from gpulayer.trainer.errors import MisconfigurationException


def do_nothing_closure() -> None:
    return None


class LightningOptimizer:
    """``opt = self.optimizers(); opt.zero_grad(); self.manual_backward(loss); opt.step()``."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self._optimizer = optimizer
        self._trainer = None
        self._on_before_step: Callable[[], None] = do_nothing_closure
        self._on_after_step: Callable[[], None] = do_nothing_closure
        # look like the wrapped optimizer's class, so isinstance checks in user code hold
        self.__class__ = type("Lightning" + type(optimizer).__name__, (self.__class__, type(optimizer)), {})

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    @classmethod
    def _to_lightning_optimizer(cls, optimizer: Any, trainer: Any) -> "LightningOptimizer":
        lo = optimizer if isinstance(optimizer, LightningOptimizer) else cls(optimizer)
        lo._trainer = trainer
        return lo

    @contextlib.contextmanager
    def toggle_model(self, sync_grad: bool = True) -> Iterator[None]:
        """Only this optimizer's parameters get gradients inside; ``sync_grad=False`` skips the DDP sync."""
        module = self._trainer.lightning_module
        sync = contextlib.nullcontext() if sync_grad or self._trainer.world_size == 1 else self._trainer.strategy.no_sync()
        with sync:
            module.toggle_optimizer(self)
            try:
                yield
            finally:
                module.untoggle_optimizer(self)

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """Run ``closure`` (if given), then one optimizer step through the Trainer's precision plugin."""
        self._on_before_step()
        if closure is None:
            closure = do_nothing_closure
        elif not callable(closure):
            raise MisconfigurationException("When `optimizer.step(closure)` is called, the closure should be callable")
        if self._trainer is None:  # outside a fit: the torch optimizer calls the closure itself (LBFGS may, many times)
            out = self._optimizer.step(closure=closure, **kwargs)
        else:
            out = stepping.optimizer_step(self._trainer, self._optimizer, closure, **kwargs)
        self._on_after_step()
        return out

    def __getattr__(self, item: str) -> Any:
        return getattr(self._optimizer, item)

    # Pickling (torch.save(trainer)): the per-instance class made in __init__ cannot be found by name, so the
    # wrapper is rebuilt around its optimizer and given back its attributes.
    def __reduce__(self) -> tuple:
        return (_rewrap, (self._optimizer,), {k: v for k, v in self.__dict__.items() if k != "_optimizer"})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # not the wrapped optimizer's __setstate__, which __getattr__ would find


def _rewrap(optimizer: torch.optim.Optimizer) -> LightningOptimizer:
    return LightningOptimizer(optimizer)


# Lightning's private helpers of the same module, which its own tests call directly
def _init_optimizers_and_lr_schedulers(model: Any) -> tuple[list, list]:
    from gpulayer.trainer.optimizers import parse
    return parse(model.configure_optimizers(), model)


def _configure_optimizers(optim_conf: Any) -> tuple[list, list, str | None]:
    from gpulayer.trainer.optimizers import _split
    return _split(optim_conf)


def _configure_schedulers_automatic_opt(schedulers: list, monitor: str | None) -> list:
    from gpulayer.trainer.optimizers import _automatic
    return _automatic(schedulers, monitor)


def _configure_schedulers_manual_opt(schedulers: list) -> list:
    from gpulayer.trainer.optimizers import _manual
    return _manual(schedulers)
