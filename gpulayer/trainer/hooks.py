"""Hook dispatch computed once per fit: a hook nobody overrides costs nothing per step.

For every hook name the Trainer keeps a list of bound callables: the callbacks'
overrides (called with ``trainer, module`` first, as in Lightning) and then the
module's. The loop writes ``for f in hooks.on_train_batch_end: f(...)``, an empty
loop when no one cares.
"""

from __future__ import annotations

import functools

from gpulayer.trainer.callbacks import Callback, EarlyStopping, ModelCheckpoint
from gpulayer.trainer.module import Module

HOOK_NAMES = (
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_train_start", "on_train_end",
    "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start", "on_train_batch_end",
    "on_validation_start", "on_validation_end", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_validation_batch_start", "on_validation_batch_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_save_checkpoint", "on_load_checkpoint",
    "on_sanity_check_start", "on_sanity_check_end",
    "on_test_start", "on_test_end", "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start", "on_test_batch_end",
    "on_predict_start", "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end", "on_predict_batch_start",
    "on_predict_batch_end",
)


def overrides(obj: object, base: type, name: str) -> bool:
    impl = getattr(type(obj), name, None)
    return impl is not None and impl is not getattr(base, name, None)


class Hooks:
    """``hooks.<name>`` is the list of callables to run for that hook (often empty)."""

    def __init__(self, trainer, module: Module, callbacks: list[Callback]):
        # monitoring callbacks see train-epoch-end metrics after the module's hook has logged its own
        monitors = [c for c in callbacks if isinstance(c, (ModelCheckpoint, EarlyStopping))]
        others = [c for c in callbacks if c not in monitors]
        for name in HOOK_NAMES:
            order = others if name == "on_train_epoch_end" else callbacks
            fns = [functools.partial(getattr(c, name), trainer, module) for c in order if overrides(c, Callback, name)]
            if hasattr(Module, name) and overrides(module, Module, name):
                fns.append(getattr(module, name))
            setattr(self, name, fns)
        self.on_train_epoch_end_monitors = [
            functools.partial(c.on_train_epoch_end, trainer, module) for c in monitors if overrides(c, Callback, "on_train_epoch_end")
        ]

    def call(self, name: str, *args) -> None:
        for fn in getattr(self, name):
            fn(*args)
