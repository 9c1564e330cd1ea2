"""Hook dispatch computed once per stage: a hook nobody overrides costs nothing per step.

For every notification hook the Trainer keeps a list of bound callables: the
callbacks' overrides (called with ``trainer, module`` first, as in Lightning) and
then the module's. A hook counts as overridden when the class redefines it or the
object carries it as an attribute (``model.on_train_epoch_end = fn``, a wrapper set
in ``__init__``). The loop writes ``for f in hooks.on_train_batch_end: f(...)``,
an empty loop when no one cares.

Hooks with a default behaviour (``optimizer_step``, ``backward``, the batch
transfer...) are not listed: the loops call them through the module. ``Hooks.general``
says whether the fit loop must take the general path that calls each of them in
Lightning's order, or may run the fast loop that does the same work inline.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from gpulayer.trainer import profilers
from gpulayer.trainer.callbacks import Callback, EarlyStopping, ModelCheckpoint, ProgressBar, TQDMProgressBar
from gpulayer.trainer.module import Module
from gpulayer.trainer.utilities.model_helpers import is_overridden

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

# Module hooks whose default does work in the training step: overriding any of them (or
# a callback's on_before_zero_grad, which Lightning calls between training_step and backward)
# sends the fit down the general loop.
STEP_HOOKS = (
    "optimizer_step", "optimizer_zero_grad", "backward", "configure_gradient_clipping", "clip_gradients",
    "on_before_zero_grad",
)
TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def customized(obj: Any, base: type, name: str) -> bool:
    """``obj`` replaces ``base.name``: on its class, or as an attribute of the object itself."""
    if name in getattr(obj, "__dict__", {}):
        return obj.__dict__[name] is not None
    impl = getattr(type(obj), name, None)
    return impl is not None and impl is not getattr(base, name, None)


def overrides(obj: object, base: type, name: str) -> bool:
    return customized(obj, base, name)


def _instance_hooks(module: Module) -> bool:
    """The module carries some of Module's methods as attributes (wrappers, lambdas): call through them."""
    own = getattr(module, "__dict__", {})
    return any(callable(v) and isinstance(getattr(Module, k, None), type(Module.setup)) for k, v in own.items())


def transfer_owner(module: Module, datamodule: Any, name: str) -> Any:
    """Whose batch-transfer hook runs: the datamodule's when it overrides it, else the module's (Lightning's rule)."""
    from gpulayer.trainer.datamodule import LightningDataModule
    if datamodule is None or not isinstance(datamodule, LightningDataModule):
        return module
    # Lightning's rule sees through wrappers of the default (is_overridden), unlike the notification lists
    if is_overridden(name, datamodule, LightningDataModule):
        if is_overridden(name, module, Module):
            warnings.warn(f"You have overridden `{name}` in both `LightningModule` and `LightningDataModule`. It will use "
                          "the implementation from `LightningDataModule` instance.", stacklevel=4)
        return datamodule
    if is_overridden(name, module, Module):
        warnings.warn(f"You have overridden `{name}` in `LightningModule` but have passed in a `LightningDataModule`. It "
                      "will use the implementation from `LightningModule` instance.", stacklevel=4)
    return module


class Hooks:
    """``hooks.<name>`` is the list of callables to run for that hook (often empty)."""

    def __init__(self, trainer, module: Module, callbacks: list[Callback], datamodule: Any = None):
        self.module = module
        # monitoring callbacks see train-epoch-end metrics after the module's hook has logged its own
        monitors = [c for c in callbacks if isinstance(c, (ModelCheckpoint, EarlyStopping))]
        others = [c for c in callbacks if c not in monitors]
        profiler = getattr(trainer, "profiler", None)
        wrap = profilers.wrapper(profiler)  # Trainer(profiler=...): each call recorded
        # as Lightning, a profile shows every callback's every hook, overridden or not (only when profiling)
        profiling = profilers.active(profiler)
        module_name = type(module).__name__
        for name in HOOK_NAMES:
            order = others if name == "on_train_epoch_end" else callbacks
            fns = [wrap(functools.partial(getattr(c, name), trainer, module), f"[Callback]{c.state_key}.{name}")
                   for c in order if profiling or customized(c, Callback, name)]
            if hasattr(Module, name) and customized(module, Module, name):
                fns.append(wrap(getattr(module, name), f"[LightningModule]{module_name}.{name}"))
            setattr(self, name, fns)
        self.on_train_epoch_end_monitors = [
            wrap(functools.partial(c.on_train_epoch_end, trainer, module), f"[Callback]{c.state_key}.on_train_epoch_end")
            for c in monitors if profiling or customized(c, Callback, "on_train_epoch_end")
        ]
        # the progress bar draws from what the loop already has: it needs no batch outputs built for it
        self.train_batch_end_outputs = any(
            not (isinstance(c, ProgressBar) and type(c).on_train_batch_end is TQDMProgressBar.on_train_batch_end)
            for c in callbacks if customized(c, Callback, "on_train_batch_end")) \
            or customized(module, Module, "on_train_batch_end")
        owners = [transfer_owner(module, datamodule, n) for n in TRANSFER_HOOKS]
        self.transfer = any(o is not module or customized(module, Module, n) for o, n in zip(owners, TRANSFER_HOOKS)) \
            or _instance_hooks(module)
        # the transfer owners, resolved once: (before, to_device, after)
        self.transfer_fns = tuple(getattr(o, n) for o, n in zip(owners, TRANSFER_HOOKS))
        self.general = (
            self.transfer or _instance_hooks(module)
            or any(customized(module, Module, n) for n in STEP_HOOKS)
            or any(customized(c, Callback, "on_before_zero_grad") for c in callbacks)
        )

    def call(self, name: str, *args, **kwargs) -> None:
        fns = getattr(self, name)
        if not fns:
            return
        module = self.module
        previous = getattr(module, "_current_fx_name", None)
        module._current_fx_name = name  # what Lightning shows while a hook runs, restored after (nested calls)
        try:
            for fn in fns:
                fn(*args, **kwargs)
        finally:
            module._current_fx_name = previous
