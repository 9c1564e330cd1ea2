"""``Precision``: Lightning's base precision plugin (full precision, ``32-true``).

A precision plugin decides how a run's numbers are kept: the dtype modules and inputs are converted to
(``convert_module``, ``convert_input``), the context each step runs under (``forward_context`` and the per-stage
``*_step_context``), and the path of a gradient: ``pre_backward`` (the loss the hooks see), ``backward``,
``post_backward``, ``optimizer_step`` (with ``on_before_optimizer_step`` and clipping after the closure) and
``clip_gradients``. The Trainer holds one (``trainer.precision_plugin``, also ``trainer.strategy.precision_plugin``)
for all its stages: its state (a loss scaler) lives as long as the Trainer.

Besides Lightning's methods, the plugin serves the Trainer's fast loop (``loop.py``, taken when no hook of the step
is customized): ``scale_loss``, ``unscale``, ``step`` and ``clip`` do the same work without the hook calls.
"""

from __future__ import annotations

import contextlib
import warnings
from functools import partial
from typing import Any, Callable, Generator

import torch
from torch import nn

from gpulayer.trainer.utilities.enums import GradClipAlgorithmType


def _always() -> bool:
    return True


def _hook_lists(module: Any) -> Any:
    """The running stage's hook lists (``hooks.py``) of the Trainer ``module`` is attached to, or None (a module
    outside a run, or a stand-in object): the plugin then calls no hooks."""
    hooks = getattr(getattr(module, "_trainer", None), "hooks", None)
    return hooks if isinstance(getattr(hooks, "on_before_backward", None), list) else None


class Precision:
    """Full precision: modules, inputs and outputs as they are; ``loss.backward()``; ``optimizer.step()``."""

    precision: str = "32-true"

    # the Trainer points it at the module's ``automatic_optimization`` (picklable: no local function)
    _automatic: Callable[[], bool] = staticmethod(_always)

    # -- modules and data -------------------------------------------------------------------------------
    def connect(self, model: Any, optimizers: list, lr_schedulers: list) -> tuple[Any, list, list]:
        """Connect the model, optimizers and schedulers to this plugin; returns them (possibly wrapped)."""
        return model, optimizers, lr_schedulers

    def convert_module(self, module: nn.Module) -> nn.Module:
        """The module in this precision's parameter dtype (unchanged here)."""
        return module

    def convert_input(self, data: Any) -> Any:
        """The batch in this precision's input dtype (unchanged here)."""
        return data

    def convert_output(self, data: Any) -> Any:
        return data

    def tensor_init_context(self) -> contextlib.AbstractContextManager:
        """Tensors created inside get this precision's dtype."""
        return contextlib.nullcontext()

    def module_init_context(self) -> contextlib.AbstractContextManager:
        """Modules created inside (``configure_model`` runs here) get this precision's dtype."""
        return self.tensor_init_context()

    def forward_context(self) -> contextlib.AbstractContextManager:
        """The context every step (training, validation, test, predict) runs under."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def train_step_context(self) -> Generator[None, None, None]:
        with self.forward_context():
            yield

    @contextlib.contextmanager
    def val_step_context(self) -> Generator[None, None, None]:
        with self.forward_context():
            yield

    @contextlib.contextmanager
    def test_step_context(self) -> Generator[None, None, None]:
        with self.forward_context():
            yield

    @contextlib.contextmanager
    def predict_step_context(self) -> Generator[None, None, None]:
        with self.forward_context():
            yield

    # -- backward ----------------------------------------------------------------------------------------
    def pre_backward(self, tensor: torch.Tensor, module: Any) -> torch.Tensor:
        """Runs ``on_before_backward``; returns the tensor ``backward`` runs on."""
        hooks = _hook_lists(module)
        if hooks is not None:
            for f in hooks.on_before_backward:
                f(tensor)
        return tensor

    def backward(self, tensor: torch.Tensor, model: Any, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        """``model.backward(tensor, *args, **kwargs)``: the module's hook, which calls ``tensor.backward``."""
        model.backward(tensor, *args, **kwargs)

    def post_backward(self, tensor: torch.Tensor, module: Any) -> torch.Tensor:
        """Runs ``on_after_backward``."""
        hooks = _hook_lists(module)
        if hooks is not None:
            for f in hooks.on_after_backward:
                f()
        return tensor

    # -- optimizer step ------------------------------------------------------------------------------------
    def _after_closure(self, model: Any, optimizer: Any) -> None:
        """After the closure, before the update: ``on_before_optimizer_step``, then (automatic optimization)
        ``configure_gradient_clipping`` with the Trainer's settings."""
        hooks = _hook_lists(model)
        if hooks is None:
            return
        for f in hooks.on_before_optimizer_step:
            f(optimizer)
        if model.automatic_optimization:
            cfg = model._trainer.config
            model.configure_gradient_clipping(optimizer, gradient_clip_val=cfg.gradient_clip_val,
                                              gradient_clip_algorithm=cfg.gradient_clip_algorithm)

    def _wrap_closure(self, model: Any, optimizer: Any, closure: Callable[[], Any]) -> Any:
        result = closure()
        self._after_closure(model, optimizer)
        return result

    def optimizer_step(self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        """``optimizer.step(closure=...)``; the closure runs the step and backward, then the hooks and clipping,
        so closure-calling optimizers (LBFGS) see clipped gradients too."""
        return optimizer.step(closure=partial(self._wrap_closure, model, optimizer, closure), **kwargs)

    # -- clipping ------------------------------------------------------------------------------------------
    def main_params(self, optimizer: Any) -> Generator[nn.Parameter, None, None]:
        """The parameters the optimizer updates (what clipping acts on)."""
        for group in optimizer.param_groups:
            yield from group["params"]

    def clip_gradients(self, optimizer: Any, clip_val: int | float = 0.0,
                       gradient_clip_algorithm: GradClipAlgorithmType | str = GradClipAlgorithmType.NORM) -> None:
        """Clip the gradients as they are now (a loss scaler, if any, already unscaled them); 0 does nothing."""
        if clip_val <= 0:
            return
        if str(gradient_clip_algorithm).lower() == GradClipAlgorithmType.VALUE:
            self.clip_grad_by_value(optimizer, clip_val)
        else:
            self.clip_grad_by_norm(optimizer, clip_val)

    def clip_grad_by_value(self, optimizer: Any, clip_val: int | float) -> None:
        torch.nn.utils.clip_grad_value_(list(self.main_params(optimizer)), clip_value=clip_val)

    def clip_grad_by_norm(self, optimizer: Any, clip_val: int | float) -> None:
        torch.nn.utils.clip_grad_norm_(list(self.main_params(optimizer)), clip_val)

    # -- the fast loop's path (no hooks to call) ---------------------------------------------------------
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The tensor ``backward`` runs on (what ``pre_backward`` returns, without the hooks)."""
        return loss

    def unscale(self, optimizer: Any) -> None:
        """Make ``.grad`` hold true gradients (before clipping or inspection)."""

    def step(self, optimizer: Any) -> None:
        optimizer.step()

    def clip(self, optimizer: Any, params: list[nn.Parameter], value: float, algorithm: Any) -> None:
        self.unscale(optimizer)
        if algorithm is not None and str(algorithm).lower() == "value":
            torch.nn.utils.clip_grad_value_(params, value)
        else:  # "norm", or None: the Trainer's default
            torch.nn.utils.clip_grad_norm_(params, value)

    # -- state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this plugin (under its class name)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    def teardown(self) -> None:
        """Called when a stage ends."""


class PrecisionPlugin(Precision):
    """Lightning's old name; use ``Precision``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _deprecated("PrecisionPlugin", "Precision")
        super().__init__(*args, **kwargs)


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"The `{old}` is deprecated. Use `gpulayer.trainer.plugins.precision.{new}` instead.",
                  DeprecationWarning, stacklevel=3)


_STEP_CONTEXTS = {"fit": "train_step_context", "train": "train_step_context", "validate": "val_step_context",
                  "test": "test_step_context", "predict": "predict_step_context"}
# what the Trainer's fast loop does itself (scale_loss, unscale, step, clip) in place of these
_STEP_METHODS = ("pre_backward", "backward", "post_backward", "optimizer_step", "_after_closure", "_wrap_closure",
                 "clip_gradients", "clip_grad_by_value", "clip_grad_by_norm", "main_params", "train_step_context")


def step_context(plugin: Precision, stage: str) -> Callable[[], Any]:
    """The plugin's context for a step of ``stage`` (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``)."""
    return getattr(plugin, _STEP_CONTEXTS.get(stage, "val_step_context"))


def _own_class(plugin: Precision) -> type:
    """The nearest class of ``plugin`` that gpulayer defines (the plugin's built-in behaviour)."""
    return next(c for c in type(plugin).__mro__ if c.__module__.startswith("gpulayer.trainer.plugins."))


def converts_input(plugin: Precision) -> bool:
    """Whether ``convert_input`` changes batches (the loops skip the call otherwise)."""
    return type(plugin).convert_input is not Precision.convert_input


def customizes_step(plugin: Precision) -> bool:
    """A user's subclass that overrides the gradient path: the Trainer then runs the general step, which calls
    every one of these methods, instead of its fast loop."""
    own = _own_class(plugin)
    return any(getattr(type(plugin), m) is not getattr(own, m) for m in _STEP_METHODS)
