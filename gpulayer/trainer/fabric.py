"""``Fabric``: Lightning Fabric's single-device subset, for a loop the user writes himself.

    fabric = Fabric(precision="bf16-mixed", loggers=CSVLogger("logs"))
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    for batch in loader:                       # batches arrive on fabric.device
        optimizer.zero_grad()
        loss = model(batch).mean()             # forward under the precision's autocast
        fabric.backward(loss)                  # the loss scaler, if any
        fabric.clip_gradients(model, optimizer, max_norm=1.0)
        optimizer.step()
        fabric.log("loss", loss)

One process on one device (CPU or one CUDA GPU); several devices, nodes or a strategy are refused
with the Trainer as the way to scale out. A ``LightningModule`` set up here logs through the Fabric's
loggers (``self.log``), clips through it (``self.clip_gradients``) and reads its optimizers
(``self.optimizers()``), as under Lightning's Fabric.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from gpulayer.trainer.config import PRECISIONS
from gpulayer.trainer.module import Module
from gpulayer.trainer.plugins.precision import MixedPrecision, Precision
from gpulayer.trainer.prefetch import move_data_to_device
from gpulayer.trainer.seed import seed_everything as _seed_everything


class Fabric:
    """Lightning Fabric's API on one device; arguments it cannot honour are refused, not ignored."""

    def __init__(self, accelerator: str = "auto", strategy: str = "auto", devices: Any = "auto", num_nodes: int = 1,
                 precision: Any = None, plugins: Any = None, callbacks: Any = None, loggers: Any = None) -> None:
        self._device = _device(accelerator, devices)
        if strategy not in ("auto", "single_device") or num_nodes != 1 or plugins is not None:
            raise ValueError(f"Fabric(strategy={strategy!r}, num_nodes={num_nodes}, plugins={plugins!r}): gpulayer's "
                             "Fabric runs one process on one device; train on several with gpulayer.trainer.Trainer")
        name = "32-true" if precision is None else precision
        if PRECISIONS.get(name) not in ("32-true", "16-mixed", "bf16-mixed"):
            raise ValueError(f"Fabric(precision={precision!r}) is not supported; one of '32-true', '16-mixed', 'bf16-mixed'")
        name = PRECISIONS[name]
        self._precision: Precision = (MixedPrecision(name, self._device.type) if name.endswith("-mixed")
                                      else Precision())
        self._callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks] if callbacks else []
        self._loggers = list(loggers) if isinstance(loggers, (list, tuple)) else [loggers] if loggers else []

    # -- where this process stands --------------------------------------------------------------
    device = property(lambda self: self._device)
    global_rank = local_rank = node_rank = 0
    world_size = 1
    is_global_zero = True

    @property
    def loggers(self) -> list:
        return self._loggers

    @property
    def logger(self) -> Any:
        """The first logger (``IndexError`` without one, as in Lightning)."""
        return self._loggers[0]

    # -- setting up the user's objects ----------------------------------------------------------------
    def setup(self, module: nn.Module, *optimizers: torch.optim.Optimizer, move_to_device: bool = True) -> Any:
        """The module (moved to the device) and the optimizers, wrapped; one object, or a tuple with optimizers."""
        wrapped = self.setup_module(module, move_to_device=move_to_device)
        opts = [FabricOptimizer(o, self) for o in optimizers]
        _attach(module, self, opts)
        return (wrapped, *opts) if opts else wrapped

    def setup_module(self, module: nn.Module, move_to_device: bool = True) -> "FabricModule":
        if move_to_device:
            module.to(self._device)
        _attach(module, self, None)
        return FabricModule(module, self)

    def setup_optimizers(self, *optimizers: torch.optim.Optimizer) -> Any:
        opts = [FabricOptimizer(o, self) for o in optimizers]
        return opts[0] if len(opts) == 1 else tuple(opts)

    def setup_dataloaders(self, *dataloaders: Any, move_to_device: bool = True) -> Any:
        """Each loader wrapped so its batches arrive on the device."""
        loaders = [FabricDataLoader(dl, self._device if move_to_device else None) for dl in dataloaders]
        return loaders[0] if len(loaders) == 1 else loaders

    # -- the step -------------------------------------------------------------------------------------------
    def backward(self, tensor: torch.Tensor, *args: Any, model: Any = None, **kwargs: Any) -> None:
        """``tensor.backward`` through the precision's loss scaler (16-mixed), if any."""
        self._precision.scale_loss(tensor).backward(*args, **kwargs)

    def clip_gradients(self, module: nn.Module, optimizer: Any, clip_val: float | None = None,
                       max_norm: float | None = None, norm_type: float = 2.0,
                       error_if_nonfinite: bool = True) -> torch.Tensor | None:
        """Clip by value (``clip_val``) or by norm (``max_norm``, which returns the norm before clipping)."""
        if clip_val is not None and max_norm is not None:
            raise ValueError(
                "Only one of `clip_val` or `max_norm` can be set as this specifies the underlying clipping algorithm!")
        optimizer = getattr(optimizer, "optimizer", optimizer)
        self._precision.unscale(optimizer)  # the threshold applies to true gradients
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if clip_val is not None:
            torch.nn.utils.clip_grad_value_(params, clip_val)
            return None
        if max_norm is not None:
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type,
                                                  error_if_nonfinite=error_if_nonfinite)
        raise ValueError("You have to specify either `clip_val` or `max_norm` to do gradient clipping!")

    def autocast(self) -> contextlib.AbstractContextManager:
        return self._precision.forward_context()

    def no_backward_sync(self, module: Any, enabled: bool = True) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # one process: nothing to sync

    def to_device(self, obj: Any) -> Any:
        return obj.to(self._device) if isinstance(obj, nn.Module) else move_data_to_device(obj, self._device)

    # -- collectives of a world of one ---------------------------------------------------------------------
    def barrier(self, name: str | None = None) -> None:
        pass

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def all_reduce(self, data: Any, group: Any = None, reduce_op: str = "mean") -> Any:
        return data

    # -- logging, callbacks, files ------------------------------------------------------------------------
    def log(self, name: str, value: Any, step: int | None = None) -> None:
        self.log_dict({name: value}, step=step)

    def log_dict(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Every logger's ``log_metrics``, one-element tensors made numbers."""
        metrics = {k: _scalar(k, v) for k, v in metrics.items()}
        for logger in self._loggers:
            logger.log_metrics(metrics=metrics, step=step)

    def call(self, hook_name: str, *args: Any, **kwargs: Any) -> None:
        """Call ``hook_name`` on every callback that has it."""
        for cb in self._callbacks:
            fn = getattr(cb, hook_name, None)
            if callable(fn):
                fn(*args, **kwargs)

    def print(self, *args: Any, **kwargs: Any) -> None:
        print(*args, **kwargs)

    def save(self, path: str | os.PathLike, state: dict[str, Any]) -> None:
        """``torch.save`` of ``state`` with modules and optimizers replaced by their ``state_dict``."""
        torch.save({k: _state_of(v) for k, v in state.items()}, path)

    def load(self, path: str | os.PathLike, state: dict[str, Any] | None = None, strict: bool = True) -> dict:
        """Load into ``state``'s modules and optimizers in place; what is left of the file is returned."""
        saved = torch.load(path, map_location=self._device, weights_only=False)
        if state is None:
            return saved
        for key, obj in state.items():
            if key not in saved:
                if strict:
                    raise KeyError(f"'{key}' is not in the checkpoint {os.fspath(path)!r} (keys: {sorted(saved)})")
                continue
            target = getattr(obj, "_module", getattr(obj, "optimizer", obj))
            if hasattr(target, "load_state_dict"):
                target.load_state_dict(saved.pop(key))
            else:
                state[key] = saved.pop(key)
        return saved

    @staticmethod
    def seed_everything(seed: int | None = None, workers: bool | None = None) -> int:
        return _seed_everything(seed, workers=bool(workers))

    def launch(self, function: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Run ``function(fabric, *args)`` here (one process: nothing to launch)."""
        return function(self, *args, **kwargs) if function is not None else None

    @contextlib.contextmanager
    def init_module(self, empty_init: bool | None = None) -> Iterator[None]:
        with self._device:
            yield


class FabricModule(nn.Module):
    """The set-up module: ``forward`` under the precision's autocast; other attributes are the module's."""

    def __init__(self, module: nn.Module, fabric: Fabric) -> None:
        super().__init__()
        self._module = module
        self._fabric_ref = fabric

    @property
    def module(self) -> nn.Module:
        return self._module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self._fabric_ref.autocast():
            return self._module(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._module.load_state_dict(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # _module and nn.Module's own
        except AttributeError:
            return getattr(self._module, name)


class FabricOptimizer:
    """The set-up optimizer: ``step`` through the precision (the loss scaler's step with 16-mixed)."""

    def __init__(self, optimizer: torch.optim.Optimizer, fabric: Fabric) -> None:
        self.optimizer = optimizer
        self._fabric = fabric

    def step(self, closure: Any = None) -> Any:
        precision = self._fabric._precision
        if closure is not None:
            return precision.optimizer_step(self.optimizer, None, closure)
        precision.step(self.optimizer)
        return None

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


class FabricDataLoader:
    """Iterates the loader with each batch moved to the device."""

    def __init__(self, loader: Any, device: torch.device | None) -> None:
        self._loader, self._device = loader, device

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self._loader:
            yield batch if self._device is None else move_data_to_device(batch, self._device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def _device(accelerator: Any, devices: Any) -> torch.device:
    """The one device of this Fabric, as the accelerator (``gpulayer.trainer.accelerators``: a name or an
    instance) places ``devices``; "auto" and -1 mean one device here."""
    from gpulayer.trainer.accelerators import Accelerator, AcceleratorRegistry, CUDAAccelerator
    if devices not in ("auto", 1, "1", -1, "-1") and not (isinstance(devices, (list, tuple)) and len(devices) == 1):
        raise ValueError(f"Fabric(devices={devices!r}): gpulayer's Fabric runs on one device; train on several with "
                         "gpulayer.trainer.Trainer(devices=...)")
    if isinstance(accelerator, Accelerator):
        chosen = accelerator
    else:
        name = accelerator.lower() if isinstance(accelerator, str) else accelerator
        if name == "auto":
            name = "cuda" if CUDAAccelerator.is_available() else "cpu"
        elif name == "gpu":
            name = "cuda"
        if name not in ("cpu", "cuda"):
            raise ValueError(f"Fabric(accelerator={accelerator!r}) is not supported; one of 'auto', 'cpu', 'cuda'")
        chosen = AcceleratorRegistry.get(name)
    if not chosen.is_available():
        raise ValueError(f"Fabric(accelerator={accelerator!r}): {type(chosen).__name__} is not available on this "
                         "machine; use accelerator='cpu'")
    one = list(devices) if isinstance(devices, (list, tuple)) and isinstance(chosen, CUDAAccelerator) else 1
    return chosen.get_parallel_devices(chosen.parse_devices(one))[0]


def _attach(module: nn.Module, fabric: Fabric, optimizers: list | None) -> None:
    if isinstance(module, Module):
        module.fabric = fabric
        if optimizers is not None:
            module._fabric_optimizers = optimizers


def _scalar(name: str, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"The metric `{value}` does not contain a single element, thus it cannot be converted "
                             "to a scalar.")
        return value.item()
    return value


def _state_of(obj: Any) -> Any:
    target = getattr(obj, "_module", getattr(obj, "optimizer", obj))
    return target.state_dict() if hasattr(target, "state_dict") and not isinstance(target, torch.Tensor) else obj
