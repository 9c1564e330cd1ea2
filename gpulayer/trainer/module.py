"""``Module``: Lightning's programming model on a plain ``torch.nn.Module``.

Hook names and meanings follow ``lightning.LightningModule``; a module written for
Lightning runs after changing its imports. Every hook has a no-op default here and
the Trainer calls only the hooks a subclass overrides (see ``hooks.py``).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import warnings
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from gpulayer.trainer.hparams import HyperparametersMixin
from gpulayer.trainer.utilities.parsing import AttributeDict  # noqa: F401  (old import path, kept working)


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
        self._metric_store = None
        self._device = None
        self._hparams: AttributeDict = AttributeDict()
        self._strict_loading: bool | None = None
        self._automatic_optimization = True
        self._param_requires_grad_state: dict = {}

    # -- what the Trainer exposes to the module -------------------------------------
    @property
    def trainer(self):
        return self._trainer

    @trainer.setter
    def trainer(self, trainer) -> None:
        self._trainer = trainer

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
        """Record a scalar: kept as a detached tensor, turned into a number only at log intervals."""
        store = self._metric_store
        if store is None:
            warnings.warn(f"self.log({name!r}) called outside Trainer.fit; the value is dropped", stacklevel=2)
            return
        if store.dl_suffix and add_dataloader_idx:
            name += store.dl_suffix
        store.log(name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, batch_size)

    def log_dict(self, dictionary: Mapping[str, Any], **kwargs: Any) -> None:
        """``self.log`` for every item of ``dictionary`` with the same options."""
        for name, value in dictionary.items():
            self.log(name, value, **kwargs)

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
        """Backward through the precision plugin (loss scaling) for manual optimization."""
        hooks = self._trainer._hooks
        for f in hooks.on_before_backward:
            f(loss)
        self._trainer._precision.backward(loss)
        for f in hooks.on_after_backward:
            f()

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        loss.backward(*args, **kwargs)

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Only ``optimizer``'s parameters require grad until ``untoggle_optimizer`` (Lightning's semantics)."""
        mine = {id(p) for g in optimizer.param_groups for p in g["params"]}
        saved = {}
        for opt in self._trainer.optimizers:
            for g in opt.param_groups:
                for p in g["params"]:
                    if id(p) not in mine and id(p) not in saved:
                        saved[id(p)] = (p, p.requires_grad)
                        p.requires_grad = False
        self._param_requires_grad_state = saved

    def untoggle_optimizer(self, optimizer: Any) -> None:
        for p, requires_grad in getattr(self, "_param_requires_grad_state", {}).values():
            p.requires_grad = requires_grad
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
        """Clip the gradients of ``optimizer``'s parameters (after unscaling), as Lightning's hook does."""
        if not gradient_clip_val:
            return
        opt = getattr(optimizer, "_optimizer", optimizer)
        params = [p for g in opt.param_groups for p in g["params"]]
        self._trainer._precision.clip(opt, params, float(gradient_clip_val), gradient_clip_algorithm or "norm")

    @property
    def logger(self) -> Any:
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self) -> list:
        return self._trainer.loggers if self._trainer is not None else []

    @property
    def automatic_optimization(self) -> bool:
        return self._automatic_optimization

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        self._automatic_optimization = value

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


LightningModule = Module  # so `from gpulayer.trainer import LightningModule` ports code with one import change
