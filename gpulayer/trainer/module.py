"""``Module``: Lightning's programming model on a plain ``torch.nn.Module``.

Hook names and meanings follow ``lightning.LightningModule``; a module written for
Lightning runs after changing its imports. Every hook has Lightning's default here
(no-op for the notification hooks) and the Trainer calls it where Lightning does;
a module that overrides none of the step hooks runs the fast loop (``hooks.py``).
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
import os
import sys
import warnings
import weakref
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from gpulayer.trainer import metrics
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.hparams import HyperparametersMixin
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


class Module(HyperparametersMixin, nn.Module):
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
        self._jit_is_scripting = False
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
        store = getattr(trainer, "__dict__", {}).get("_store")
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
    def device(self) -> torch.device:
        if self._device is not None:
            return self._device
        for p in self.parameters():
            return p.device
        return torch.device("cpu")

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
                             strict: bool | None = None, **kwargs: Any) -> "Module":
        """A new ``cls`` built from the checkpoint's saved hyperparameters (``kwargs`` override them), weights loaded.

        >>> model = Net.load_from_checkpoint("epoch=9-step=100.ckpt", lr=1e-4)   # doctest: +SKIP
        """
        from gpulayer.trainer.core.saving import load_from_checkpoint
        return load_from_checkpoint(cls, checkpoint_path, map_location, hparams_file, strict, **kwargs)

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

    # -- logging ---------------------------------------------------------------------
    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: Any = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: Any = None,
        add_dataloader_idx: bool = True,
        batch_size: int | None = None,
        metric_attribute: str | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """Record a scalar (a number, a one-element tensor or a ``torchmetrics.Metric``), Lightning's ``log``.

        Defaults of ``on_step`` / ``on_epoch`` and where logging is allowed follow the running hook
        (``metrics.FX_RULES``). Tensors stay on the device; numbers are made at log intervals.
        """
        if self._fabric is not None:
            return self._log_through_fabric({name: value}, logger)
        return self._log(sys._getframe(1), name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, enable_graph,
                         sync_dist, sync_dist_group, add_dataloader_idx, batch_size, metric_attribute, rank_zero_only)

    def _log_through_fabric(self, values: Mapping[str, Any], logger: bool | None) -> None:
        """Set up with Fabric: straight to its loggers (no reduction); ``logger=False`` logs nowhere."""
        if logger is False:
            return
        for name, value in values.items():
            if isinstance(value, Mapping):
                raise ValueError(f"`self.log_dict({dict(values)})` was called, but nested dictionaries cannot be logged")
            if not (isinstance(value, (numbers.Number, torch.Tensor)) or metrics.is_torchmetric(value)):
                raise ValueError(f"`self.log({name}, {value})` was called, but `{type(value).__name__}` values cannot "
                                 "be logged")
        self._fabric.log_dict(metrics=dict(values))

    def _log(self, frame, name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, enable_graph, sync_dist,
             sync_dist_group, add_dataloader_idx, batch_size, metric_attribute, rank_zero_only) -> None:
        metric = None
        if isinstance(value, torch.Tensor):
            if value.ndim:  # a 0-dim tensor (the usual loss) needs no check and no reshape
                if value.numel() != 1:
                    raise ValueError(f"`self.log({name}, {value})` was called, but the tensor must have a single "
                                     f"element. You can try doing `self.log({name}, {value}.mean())`")
                value = value.reshape(())
        elif isinstance(value, numbers.Number):
            value = torch.tensor(value, device=self.device, dtype=metrics.float_dtype())
        elif metrics.is_torchmetric(value):
            metric = value
        elif isinstance(value, Mapping):
            raise ValueError(f"`self.log({name}, {value})` was called, but `dict` values cannot be logged;"
                             " use self.log_dict(...) for several values")
        else:
            raise ValueError(f"`self.log({name}, {value})` was called, but `{type(value).__name__}` values cannot be"
                             " logged (log a number, a one-element tensor or a torchmetrics.Metric)")
        if self._trainer is not None and getattr(self._trainer, "barebones", False):
            warnings.warn("You are trying to `self.log()` but `Trainer(barebones=True)` is configured. Logging can "
                          "impact raw speed so it is disabled under this setting.", stacklevel=3)
            return
        store = self._metric_store
        if store is None:
            warnings.warn("You are trying to `self.log()` but the `self.trainer` reference is not registered on the"
                          " model yet. This is most likely because the model hasn't been passed to the `Trainer`",
                          stacklevel=3)
            return
        if store.context is store.PREDICT:
            raise MisconfigurationException(
                "You are trying to `self.log()` but the loop's result collection is not registered yet. This is most "
                "likely because you are trying to log in a `predict` hook, but it doesn't support logging")
        fx = metrics.current_hook(frame) or self._current_fx_name
        if add_dataloader_idx and "/dataloader_idx_" in name:
            raise MisconfigurationException(
                f"You called `self.log` with the key `{name}` but it should not contain information about "
                "`dataloader_idx` when `add_dataloader_idx=True`")
        if metric is not None:
            self._check_metric_attribute(name, metric, metric_attribute)
        elif metric_attribute is not None:
            raise MisconfigurationException(
                f"self.log({name!r}, ..., metric_attribute={metric_attribute!r}) names the module attribute of a "
                "logged torchmetrics.Metric; the value is not one: drop metric_attribute")
        elif value.dtype is not torch.float32 and value.dtype is not torch.float64:  # `is`: dtypes are singletons
            if not torch.is_floating_point(value):
                metrics.warn_once(
                    f"You called `self.log({name!r}, ...)` in your `{fx}` but the value needs to be floating to be "
                    f"reduced. Converting it to {metrics.float_dtype()}. You can silence this warning by converting "
                    "the value to floating point yourself. If you don't intend to reduce the value (for instance when "
                    f"logging the global step or epoch) then you can use `self.logger.log_metrics({{{name!r}: ...}})` "
                    "instead.")
            value = value.to(metrics.float_dtype())
        if sync_dist_group is not None and not sync_dist:
            raise MisconfigurationException(
                f"self.log({name!r}, ..., sync_dist_group=...) reduces over that group only with sync_dist=True;"
                " pass sync_dist=True or drop sync_dist_group")
        if logger and self._trainer is not None and self._trainer.logger is None:
            warnings.warn(f"You called `self.log({name!r}, ..., logger=True)` but have no logger configured. You can "
                          "enable one by doing `Trainer(logger=ALogger(...))`", stacklevel=3)
        store.log(fx, name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, enable_graph, sync_dist,
                  sync_dist_group, add_dataloader_idx, batch_size, metric, rank_zero_only)

    def _check_metric_attribute(self, name: str, metric: Any, metric_attribute: str | None) -> None:
        """Lightning needs the module attribute holding a logged Metric (it restores the metric's state by it)."""
        found = {id(m): n for n, m in self.named_modules() if metrics.is_torchmetric(m)}
        if metric_attribute is not None:
            if found.get(id(metric)) != metric_attribute and getattr(self, metric_attribute, None) is not metric:
                raise MisconfigurationException(
                    f"self.log({name!r}, ..., metric_attribute={metric_attribute!r}): the module has no attribute "
                    f"{metric_attribute!r} holding the logged metric; attributes holding metrics: {list(found.values())}")
            return
        if not found:
            raise MisconfigurationException(
                "Could not find the `LightningModule` attribute for the `torchmetrics.Metric` logged. You can fix this"
                " by setting an attribute for the metric in your `LightningModule`.")
        if id(metric) not in found:
            raise MisconfigurationException(
                "Could not find the `LightningModule` attribute for the `torchmetrics.Metric` logged. You can fix this"
                f" by calling `self.log({name}, ..., metric_attribute=name)` where `name` is one of "
                f"{list(found.values())}")

    def log_dict(self, dictionary: Mapping[str, Any], prog_bar: bool = False, logger: bool | None = None,
                 on_step: bool | None = None, on_epoch: bool | None = None, reduce_fx: Any = "mean",
                 enable_graph: bool = False, sync_dist: bool = False, sync_dist_group: Any = None,
                 add_dataloader_idx: bool = True, batch_size: int | None = None, rank_zero_only: bool = False) -> None:
        """``self.log`` for every item of ``dictionary`` (or a ``torchmetrics.MetricCollection``) with the same options."""
        if self._fabric is not None:
            return self._log_through_fabric(dictionary, logger)
        frame = sys._getframe(1)
        items = dictionary.items(keep_base=False) if metrics.is_metric_collection(dictionary) else dictionary.items()
        for name, value in items:
            self._log(frame, name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, enable_graph, sync_dist,
                      sync_dist_group, add_dataloader_idx, batch_size, None, rank_zero_only)

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
        opts = self._trainer._lightning_optimizers if use_pl_optimizer else self._trainer.optimizers
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
        self._trainer._backward(loss, *args, **kwargs)

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
        cfg = self.trainer._config
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
        self._trainer._precision.clip_gradients(opt, float(gradient_clip_val), gradient_clip_algorithm)

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
        """``print`` on global rank 0 only."""
        if self.global_rank == 0:
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
