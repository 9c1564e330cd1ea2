"""``Module``: Lightning's programming model on a plain ``torch.nn.Module``.

Hook names and meanings follow ``lightning.LightningModule``; a module written for
Lightning runs after changing its imports. Every hook has Lightning's default here
(no-op for the notification hooks) and the Trainer calls it where Lightning does;
a module that overrides none of the step hooks runs the fast loop (``hooks.py``).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import weakref
from typing import Any, Iterator

import torch
from torch import nn

from gpulayer.trainer import metrics
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.export import ExportMixin
from gpulayer.trainer.hparams import HyperparametersMixin
from gpulayer.trainer.module_logging import ModuleLogging
from gpulayer.trainer.prefetch import move_data_to_device
from gpulayer.trainer.utilities.parsing import AttributeDict  # noqa: F401  (old import path, kept working)


class TrainerFabricShim:
    """What ``self.trainer`` is in a LightningModule set up with Fabric: the few attributes Fabric has."""

    _SHARED = ("global_rank", "local_rank", "node_rank", "world_size", "is_global_zero", "loggers", "logger")

    def __init__(self, fabric: Any) -> None:
        self._fabric = fabric

    def __getattr__(self, name: str) -> Any:
        if name in self._SHARED:
            return getattr(self._fabric, name)
        raise AttributeError(
            f"Your LightningModule code tried to access `self.trainer.{name}` but this attribute is not available "
            "when using Fabric with a LightningModule.")


class _restricted_classmethod(classmethod):
    """A classmethod that refuses to run on an instance: ``model.load_from_checkpoint(p)`` would discard its result."""

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        # TorchScript reads every attribute of the module it compiles: let it through
        if instance is not None and not any(os.path.join("torch", "jit") in f.filename for f in inspect.stack(0)):
            name = self.__func__.__name__
            raise TypeError(f"The classmethod `{type(instance).__name__}.{name}` cannot be called on an instance. "
                            "Please call it on the class type and make sure the return value is used.")
        return super().__get__(instance, owner)


class Module(ExportMixin, HyperparametersMixin, ModuleLogging, nn.Module):
    """Subclass and write ``training_step`` and ``configure_optimizers``.

    >>> class Net(Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.layer = torch.nn.Linear(4, 1)
    ...     def training_step(self, batch, batch_idx):
    ...         x, y = batch
    ...         loss = torch.nn.functional.mse_loss(self.layer(x), y)
    ...         self.log("train_loss", loss)
    ...         return loss
    ...     def configure_optimizers(self):
    ...         return torch.optim.SGD(self.parameters(), lr=0.1)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer = None
        self._fabric = None
        self._fabric_optimizers: list = []
        self._current_fx_name: str | None = None  # the hook self.log counts as when the call stack names none
        self._metric_store = None
        self._device = None
        self._hparams: AttributeDict = AttributeDict()
        self._strict_loading: bool | None = None
        self._automatic_optimization = True
        self._param_requires_grad_state: dict = {}
        self._current_fx_name: str | None = None  # the hook the Trainer is running (hooks.Hooks.call), else None

    # -- what the Trainer exposes to the module -------------------------------------
    @property
    def trainer(self):
        """The Trainer running this module; a module that none runs raises (Lightning's ``RuntimeError``)."""
        if self._fabric is not None:
            return TrainerFabricShim(self._fabric)
        if self._trainer is None and not self._jit_is_scripting:
            raise RuntimeError(f"{type(self).__qualname__} is not attached to a `Trainer`.")
        return self._trainer

    @trainer.setter
    def trainer(self, trainer) -> None:
        # nested modules (an ensemble's members) see the same Trainer
        for child in self.children():
            if isinstance(child, Module):
                child.trainer = trainer
        self._trainer = trainer
        # self.log reaches the Trainer's metrics from here on, also outside its loops (Lightning's)
        store = getattr(trainer, "__dict__", {}).get("metric_store")
        self._metric_store = store if isinstance(store, metrics.MetricStore) else None

    @property
    def fabric(self):
        """The ``Fabric`` this module was set up with (``fabric.setup(module)``), else None."""
        return self._fabric

    @fabric.setter
    def fabric(self, fabric) -> None:
        for child in self.children():
            if isinstance(child, Module):
                child.fabric = fabric
        # a weak reference: the module must not keep its Fabric alive
        if fabric is not None and not isinstance(fabric, weakref.ProxyTypes):
            fabric = weakref.proxy(fabric)
        self._fabric = fabric

    @property
    def device_mesh(self) -> Any:
        """Lightning's: the ``DeviceMesh`` of a sharded run (``ModelParallelStrategy``, ``"fsdp"``), for
        ``configure_model`` to parallelize on; None under any other strategy."""
        strategy = getattr(self._trainer, "strategy", None)
        return getattr(strategy, "_device_mesh", None)  # the strategy's own property raises before the group exists

    @property
    def device(self) -> torch.device:
        if self._device is not None:
            return self._device
        for p in self.parameters():
            return p.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the module's floating-point parameters (torch's default when it has none)."""
        for p in self.parameters():
            if p.is_floating_point():
                return p.dtype
        return torch.get_default_dtype()

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_rank(self) -> int:
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        return self._trainer.local_rank if self._trainer is not None else 0

    CHECKPOINT_HYPER_PARAMS_KEY = "hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "hparams_type"

    @_restricted_classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None, hparams_file: Any = None,
                             strict: bool | None = None, weights_only: bool | None = None,
                             **kwargs: Any) -> "Module":
        """A new ``cls`` built from the checkpoint's saved hyperparameters (``kwargs`` override them), weights loaded.

        >>> model = Net.load_from_checkpoint("epoch=9-step=100.ckpt", lr=1e-4)   # doctest: +SKIP
        """
        from gpulayer.trainer.core.saving import load_from_checkpoint
        return load_from_checkpoint(cls, checkpoint_path, map_location, hparams_file, strict, weights_only, **kwargs)

    @property
    def strict_loading(self) -> bool:
        """Whether ``load_state_dict`` of a checkpoint requires every key to match (default True)."""
        return True if self._strict_loading is None else self._strict_loading

    @strict_loading.setter
    def strict_loading(self, strict: bool) -> None:
        self._strict_loading = strict

    def __getstate__(self) -> dict[str, Any]:
        # a module pickled for the ranks of a multi-process fit leaves the parent's trainer behind
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        state = dict(state)
        state["_trainer"] = None
        state["_fabric"] = None
        state["_metric_store"] = None
        return state

    # -- the step and optimizer hooks --------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return super().forward(*args, **kwargs)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("your Module must define training_step(self, batch, batch_idx) returning the loss")

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's default: ``self(batch)``."""
        batch = kwargs.get("batch", args[0])
        return self(batch)

    def configure_optimizers(self) -> Any:
        raise NotImplementedError(
            "your Module must define configure_optimizers(self), e.g. return torch.optim.AdamW(self.parameters(), lr=1e-3)"
        )

    def configure_callbacks(self) -> Any:
        return []

    def train_dataloader(self) -> Any:
        return None

    def val_dataloader(self) -> Any:
        return None

    def test_dataloader(self) -> Any:
        return None

    def predict_dataloader(self) -> Any:
        return None

    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        """The optimizers of ``configure_optimizers`` (one, or a list), wrapped as ``LightningOptimizer``."""
        if self._fabric is not None:
            opts = self._fabric_optimizers
            return opts[0] if len(opts) == 1 else opts
        if self._trainer is None:
            return []
        opts = self._trainer.lightning_optimizers if use_pl_optimizer else self._trainer.optimizers
        return opts[0] if len(opts) == 1 else opts

    def lr_schedulers(self) -> Any:
        scheds = [c.scheduler for c in self._trainer.lr_scheduler_configs] if self._trainer is not None else []
        if not scheds:
            return None
        return scheds[0] if len(scheds) == 1 else scheds

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward for manual optimization: the hooks around it and the loss scaler, as ``backward`` gets in automatic."""
        if self.automatic_optimization:
            raise MisconfigurationException(
                "to use manual_backward, please disable automatic optimization: set model property "
                "`automatic_optimization` as False")
        self._trainer.strategy.backward(loss, kwargs.pop("optimizer", None), *args, **kwargs)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Compute gradients of ``loss`` (already scaled by the precision's loss scaler, if any)."""
        loss.backward(*args, **kwargs)

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Only ``optimizer``'s parameters require grad until ``untoggle_optimizer`` (Lightning's semantics).

        ``_param_requires_grad_state`` keeps, for every parameter of every optimizer, the flag it had.
        """
        saved: dict = {}
        for opt in self.trainer.optimizers:
            for g in opt.param_groups:
                for p in g["params"]:
                    if p not in saved:
                        saved[p] = p.requires_grad
                        p.requires_grad = False
        for g in optimizer.param_groups:  # the toggled optimizer's own parameters keep their flag
            for p in g["params"]:
                p.requires_grad = saved.get(p, p.requires_grad)
        self._param_requires_grad_state = saved

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Give the other optimizers' parameters back the ``requires_grad`` they had before ``toggle_optimizer``."""
        inner = getattr(optimizer, "_optimizer", optimizer)
        for opt in self.trainer.optimizers:
            if opt is optimizer or opt is inner:
                continue
            for g in opt.param_groups:
                for p in g["params"]:
                    if p in self._param_requires_grad_state:
                        p.requires_grad = self._param_requires_grad_state[p]
        self._param_requires_grad_state = {}

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def clip_gradients(self, optimizer: Any, gradient_clip_val: float | None = None,
                       gradient_clip_algorithm: str | None = None) -> None:
        """Clip ``optimizer``'s gradients (unscaled by then); the Trainer's values unless given here, never both."""
        if self._fabric is not None:  # set up with Fabric: it clips, with its precision's unscaling
            by_value = gradient_clip_algorithm is not None and gradient_clip_algorithm.lower() == "value"
            self._fabric.clip_gradients(self, optimizer, clip_val=gradient_clip_val if by_value else None,
                                        max_norm=None if by_value else gradient_clip_val)
            return
        cfg = self.trainer.config
        trainer_val, trainer_algo = cfg.gradient_clip_val, cfg.gradient_clip_algorithm
        if gradient_clip_val is None:
            gradient_clip_val = trainer_val or 0.0
        elif trainer_val is not None and trainer_val != gradient_clip_val:
            raise MisconfigurationException(
                f"You have set `Trainer(gradient_clip_val={trainer_val!r})` and have passed "
                f"`clip_gradients(gradient_clip_val={gradient_clip_val!r})`. Please use only one of them.")
        if gradient_clip_algorithm is None:
            gradient_clip_algorithm = trainer_algo or "norm"
        else:
            gradient_clip_algorithm = gradient_clip_algorithm.lower()
            if trainer_algo is not None and trainer_algo != gradient_clip_algorithm:
                raise MisconfigurationException(
                    f"You have set `Trainer(gradient_clip_algorithm='{str(trainer_algo)}')` and have passed "
                    f"`clip_gradients(gradient_clip_algorithm='{str(gradient_clip_algorithm)}') Please use only one "
                    "of them.")
        if not isinstance(gradient_clip_val, (int, float)):
            raise TypeError(f"`gradient_clip_val` should be an int or a float. Got {gradient_clip_val}.")
        if gradient_clip_algorithm not in ("norm", "value"):
            raise MisconfigurationException(
                f"`gradient_clip_algorithm` {gradient_clip_algorithm} is invalid. Allowed algorithms: ['value', 'norm'].")
        opt = getattr(optimizer, "_optimizer", optimizer)
        self._trainer.precision_plugin.clip_gradients(opt, float(gradient_clip_val), gradient_clip_algorithm)

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Called before every optimizer step with the Trainer's clip settings; the default clips with them.

        >>> def configure_gradient_clipping(self, optimizer, gradient_clip_val, gradient_clip_algorithm):
        ...     if self.current_epoch > 5:   # clip only later in training
        ...         self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        """
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        """Step ``optimizer``; ``optimizer_closure`` runs training_step, zero_grad and backward when the optimizer calls it.

        Override for LR warm-up and the like; call ``optimizer.step(closure=optimizer_closure)`` in it.
        Not called on the accumulating batches of ``accumulate_grad_batches``.
        """
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        """Reset the gradients (to None, torch's default) before the backward of a new accumulation window."""
        optimizer.zero_grad()

    # -- data hooks: where a batch goes before the step ---------------------------------------
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move ``batch`` to ``device``: tensors in lists, tuples, dicts, dataclasses, and objects with ``.to``."""
        return move_data_to_device(batch, device)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change ``batch`` before it moves to the device (e.g. CPU-side augmentation)."""
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change ``batch`` once on the device (e.g. GPU-side augmentation)."""
        return batch

    def configure_model(self) -> None:
        """Create layers here to build them on the device (called at each stage's setup, before the optimizers)."""

    def configure_sharded_model(self) -> None:
        """Lightning's older name of ``configure_model``; still called when overridden."""

    # -- train / eval mode around evaluation -----------------------------------------------
    def on_validation_model_zero_grad(self) -> None:
        """Before validation inside fit: free the gradients' memory."""
        self.zero_grad()

    def on_validation_model_eval(self) -> None:
        self.trainer.model.eval()

    def on_validation_model_train(self) -> None:
        self.trainer.model.train()

    def on_test_model_eval(self) -> None:
        self.trainer.model.eval()

    def on_test_model_train(self) -> None:
        self.trainer.model.train()

    def on_predict_model_eval(self) -> None:
        self.trainer.model.eval()

    def on_predict_model_train(self) -> None:
        self.trainer.model.train()

    @property
    def logger(self) -> Any:
        if self._fabric is not None:
            return self._fabric.logger
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self) -> list:
        if self._fabric is not None:
            return self._fabric.loggers
        return self._trainer.loggers if self._trainer is not None else []

    @property
    def automatic_optimization(self) -> bool:
        return self._automatic_optimization

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        self._automatic_optimization = value

    def freeze(self) -> "Module":
        """For inference: every parameter stops requiring gradients and the module goes to eval mode."""
        for param in self.parameters():
            param.requires_grad = False
        return self.eval()

    def unfreeze(self) -> "Module":
        """Undo ``freeze``: every parameter requires gradients again, train mode."""
        for param in self.parameters():
            param.requires_grad = True
        return self.train()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only; through the progress bar while one draws, so its line stays intact."""
        if self.global_rank == 0:
            bar = self._trainer.progress_bar_callback if self._trainer is not None else None
            if bar is not None and getattr(bar, "is_enabled", False):
                bar.print(*args, **kwargs)
            else:
                print(*args, **kwargs)

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    # -- lifecycle hooks: no-ops unless overridden ---------------------------------------
    def setup(self, stage: str) -> None: ...
    def teardown(self, stage: str) -> None: ...
    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any: ...
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def prepare_data(self) -> None: ...
    def on_before_backward(self, loss: torch.Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def on_exception(self, exception: BaseException) -> None: ...


# TorchScript compiles a module's properties unless listed here; these read the Trainer, which it cannot type
Module.__jit_unused_properties__ = sorted(
    {name for klass in Module.__mro__ for name, v in vars(klass).items() if isinstance(v, property)}
    | set(getattr(nn.Module, "__jit_unused_properties__", [])))

LightningModule = Module  # so `from gpulayer.trainer import LightningModule` ports code with one import change
