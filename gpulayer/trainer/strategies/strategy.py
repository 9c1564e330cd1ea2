"""Strategies: where the module lives and how ranks agree (single device, DDP in a rank).

A strategy runs inside one process. Starting the processes of a multi-process
fit is the launcher's job (``launcher.py``); a distributed job of the cluster can
start them instead and call ``fit_rank`` in each, since DDP here only reads
torchrun's environment variables.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.overrides import TorchFunctionMode

from gpulayer.trainer import allocator, data, gradsync, stepping


class Strategy:
    """Lightning's ``strategies.Strategy``: what every strategy does the same way.

    ``backward`` is the one path of every backward the Trainer runs for the user (``manual_backward``, the
    automatic closure): the precision's loss scaling, ``on_before_backward``, ``module.backward``,
    ``on_after_backward``. The Trainer that runs the strategy sets ``_trainer``.
    """

    _trainer: Any = None
    _checkpoint_io: Any = None  # a plugins.io.CheckpointIO given; None: TorchCheckpointIO on first use
    _precision_plugin: Any = None  # the Trainer sets it (config.precision_plugin); None: full precision

    @property
    def checkpoint_io(self) -> Any:
        """How checkpoint files are written, read and removed (Lightning's ``strategy.checkpoint_io``)."""
        from gpulayer.trainer.plugins.io.wrapper import resolve
        self._checkpoint_io = resolve(self._checkpoint_io)
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: Any) -> None:
        self._checkpoint_io = io

    @property
    def precision_plugin(self) -> Any:
        """The precision every step runs with (the same object as ``trainer.precision_plugin``)."""
        if self._precision_plugin is None:
            from gpulayer.trainer.plugins.precision import Precision
            self._precision_plugin = Precision()
        return self._precision_plugin

    @precision_plugin.setter
    def precision_plugin(self, plugin: Any) -> None:
        self._precision_plugin = plugin

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self._trainer is None:
            raise RuntimeError("Strategy.backward runs inside a Trainer's fit; this strategy is attached to none")
        return stepping.backward(self._trainer, closure_loss, optimizer, *args, **kwargs)

    _optimizers: list | None = None  # set through ``optimizers``; None: the attached Trainer's

    @property
    def optimizers(self) -> list:
        """The run's optimizers (Lightning's ``strategy.optimizers``): those set here, else the Trainer's."""
        if self._optimizers is not None:
            return self._optimizers
        return list(self._trainer.optimizers) if self._trainer is not None else []

    @optimizers.setter
    def optimizers(self, optimizers: list) -> None:
        from gpulayer.trainer.core.optimizer import LightningOptimizer
        self._optimizers = list(optimizers)
        self._lightning_optimizers = [LightningOptimizer(o) for o in self._optimizers]

    def __getstate__(self) -> dict[str, Any]:
        # a LightningOptimizer's class is made at run time (it mimics the optimizer's): rebuilt after unpickling
        return {k: v for k, v in self.__dict__.items() if k != "_lightning_optimizers"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._optimizers is not None:
            self.optimizers = self._optimizers

    @contextlib.contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Any:
        """Tensors created inside land on the root device in the precision's dtype; ``empty_init=True`` also
        skips their initialization (``Trainer.init_module``)."""
        with init_context(self.root_device, empty_init), self.precision_plugin.tensor_init_context():
            yield

    @property
    def lightning_restore_optimizer(self) -> bool:
        """Whether the Trainer restores the optimizers' states from a checkpoint through
        ``load_optimizer_state_dict`` (a strategy that restores them itself returns False)."""
        return True

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        """Each optimizer's state from ``checkpoint["optimizer_states"]``, in order."""
        for optimizer, state in zip(self.optimizers, checkpoint.get("optimizer_states", [])):
            self.load_optimizer_state(optimizer, state)

    def on_exception(self, exception: BaseException) -> None:
        """Called when a stage ends with an error (after the callbacks' ``on_exception``); nothing to undo here."""

    # checkpoints: global rank 0 writes and reads whole files (a sharded strategy overrides these: fsdp.py)
    def save_checkpoint(self, ckpt: dict[str, Any], path: str, storage_options: Any = None) -> None:
        if self.is_global_zero:
            self.checkpoint_io.save_checkpoint(ckpt, path, storage_options=storage_options)

    def load_checkpoint(self, path: str, weights_only: bool | None = None) -> dict[str, Any]:
        return self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)

    def load_optimizer_state(self, optimizer: Any, state: dict[str, Any]) -> None:
        optimizer.load_state_dict(state)

    def remove_checkpoint(self, path: str) -> None:
        if self.is_global_zero:
            self.checkpoint_io.remove_checkpoint(path)

    def lightning_module_state_dict(self) -> dict[str, torch.Tensor]:
        """The module's whole weights, as the caller of a multi-process fit gets them back."""
        return self.lightning_module.state_dict()


class SingleDeviceStrategy(Strategy):
    """One process, one device."""

    global_rank = 0
    local_rank = 0
    world_size = 1
    is_global_zero = True

    def __init__(self, device: torch.device | str | int = "cpu", accelerator: Any = None, checkpoint_io: Any = None,
                 precision_plugin: Any = None):
        self._device = device if isinstance(device, torch.device) else torch.device(device)
        self._checkpoint_io, self._precision_plugin = checkpoint_io, precision_plugin
        self.model: nn.Module | None = None  # what the training step is called through
        self.lightning_module: nn.Module | None = None  # the user's module (``trainer.lightning_module``)

    @property
    def root_device(self) -> torch.device:
        """The device this process runs on (a subclass may compute it: Lightning's strategies do)."""
        return self._device

    @root_device.setter
    def root_device(self, device: torch.device) -> None:
        self._device = device

    def connect(self, model: nn.Module) -> None:
        """Hold ``model`` as the module of the run (Lightning's ``strategy.connect``), before any setup."""
        self.lightning_module = model
        self.model = model

    def setup_environment(self) -> None:
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        else:
            allocator.keep_freed_memory()  # no page faults for each step's activations (allocator.py)

    def setup_eval_module(self, module: nn.Module) -> None:
        """Move the module for validate / test / predict (no DDP wrapper: nothing to sync)."""
        module = self.precision_plugin.convert_module(module)  # in place: the user's module itself
        module.to(self.root_device)
        module._device = self.root_device
        self.model = self.lightning_module = module

    def setup_module(self, module: nn.Module) -> Any:
        """Move the module; return the callable the loop runs the training step through."""
        module = self.precision_plugin.convert_module(module)  # in place: the user's module itself
        module.to(self.root_device)
        module._device = self.root_device
        self.model = self.lightning_module = module
        return module.training_step

    def prepare_loader(self, loader: Any, mode: str = "train") -> Any:
        return loader

    def no_sync(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        return tensor

    def any(self, flag: bool) -> bool:
        return flag

    def all(self, flag: bool) -> bool:
        return flag

    def broadcast_flag(self, flag: bool) -> bool:
        return flag

    def barrier(self) -> None:
        pass

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` (one process: ``obj`` itself)."""
        return obj

    def teardown(self) -> None:
        if self._checkpoint_io is not None:  # an asynchronous writer finishes its writes here
            self._checkpoint_io.teardown()
        if self._precision_plugin is not None:
            self._precision_plugin.teardown()
        if self.root_device.type == "cpu":
            allocator.release()

    def describe(self) -> dict[str, Any]:
        """What ran: strategy, world, and how gradients were synced (``Trainer.fit_info``)."""
        return {"strategy": "single_device", "device": str(self.root_device), "world_size": 1, "num_nodes": 1,
                "grad_sync": None, "backend": None}


class _TrainingStep(nn.Module):
    """DDP must see the forward that builds the loss: this one runs ``training_step``."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args: Any) -> Any:  # (batch, batch_idx), (batch) or (dataloader_iter): the step's signature
        return self.module.training_step(*args)


class DDPStrategy(SingleDeviceStrategy):
    """Data parallel inside a process whose torchrun environment is set (RANK, WORLD_SIZE, MASTER_ADDR...)."""

    def __init__(self, device: torch.device | None = None, grad_sync: str = "auto",
                 find_unused_parameters: bool = False, timeout_s: float = 1800.0, planned_world_size: int = 1,
                 checkpoint_io: Any = None, precision_plugin: Any = None, process_group_backend: str | None = None):
        # built outside a launched rank (``DDPStrategy()`` as a Lightning user writes it, or a Trainer's strategy
        # before its fit launches the ranks): rank 0 of the world it will launch
        self.global_rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", planned_world_size))
        self.is_global_zero = self.global_rank == 0
        if device is None or (device.type == "cuda" and device.index is None):
            device = torch.device("cuda", self.local_rank) if device is not None else torch.device("cpu")
        super().__init__(device, checkpoint_io=checkpoint_io, precision_plugin=precision_plugin)
        self.grad_sync = grad_sync
        self.find_unused_parameters = find_unused_parameters
        self.timeout_s = timeout_s
        self.ddp: nn.parallel.DistributedDataParallel | None = None
        self.backend: str | None = None
        self._process_group_backend = process_group_backend
        self.comm_hook = "flat"  # "shared_memory" or "two_level" once gradsync installs its hook
        self._sync_state: gradsync.TwoLevelState | None = None
        self._owns_group = False
        self._layer_sync: Any = None  # a plugins.layer_sync.LayerSync applied to the module before DDP wraps it
        self._cluster_environment: Any = None

    @property
    def cluster_environment(self) -> Any:
        """Where this rank's world comes from (``plugins.environments``): the one given in ``Trainer(plugins=)``,
        else the detected one. gpulayer's launcher sets torchrun's variables in every rank it starts."""
        if self._cluster_environment is None:
            from gpulayer.trainer.plugins.environments import detect_environment
            self._cluster_environment = detect_environment()
        return self._cluster_environment

    @cluster_environment.setter
    def cluster_environment(self, env: Any) -> None:
        self._cluster_environment = env

    @property
    def is_distributed(self) -> bool:
        """Always True (Lightning's deprecated property)."""
        warnings.warn("`DDPStrategy.is_distributed` is deprecated and will be removed in a future release: a "
                      "`DDPStrategy` always runs distributed.", DeprecationWarning, stacklevel=2)
        return True

    def setup_environment(self) -> None:
        super().setup_environment()
        if self.root_device.type == "cpu":
            # torchrun's rule: the machine's cores shared among its processes
            per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", max(1, (os.cpu_count() or 1) // per_node))))
        if not dist.is_initialized():
            backend = self._get_process_group_backend()
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=self.timeout_s),
                                    **({"device_id": self.root_device} if backend == "nccl" else {}))
            self._owns_group = True
        self.backend = dist.get_backend()

    @property
    def process_group_backend(self) -> str | None:
        """The backend asked for (``DDPStrategy(process_group_backend=...)``); None: the device's default."""
        return self._process_group_backend

    def _get_process_group_backend(self) -> str:
        """The backend the group is made with: the one asked for, else nccl on CUDA and gloo on the CPU."""
        return self._process_group_backend or ("nccl" if self.root_device.type == "cuda" else "gloo")

    def setup_module(self, module: nn.Module) -> Any:
        if self._layer_sync is not None:  # in place below the module itself (it is never a BatchNorm)
            module = self._layer_sync.apply(module)
        module.to(self.root_device)
        module._device = self.root_device
        self.lightning_module = module
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        # gradients live in DDP's flat buckets: no copy between .grad and the bucket before and after the sync
        self.ddp = nn.parallel.DistributedDataParallel(
            _TrainingStep(module), device_ids=device_ids, find_unused_parameters=self.find_unused_parameters,
            gradient_as_bucket_view=True,
        )
        self._sync_state = gradsync.register(self.ddp, self.grad_sync, self.timeout_s)
        self.comm_hook = self._sync_state.name if self._sync_state is not None else "flat"
        self.model = self.ddp
        return self.ddp

    def prepare_loader(self, loader: Any, mode: str = "train") -> Any:
        return data.distributed(loader, self.world_size, self.global_rank, mode)

    def no_sync(self) -> contextlib.AbstractContextManager:
        return self.ddp.no_sync()

    def reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        tensor = tensor.clone()
        red = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
        dist.all_reduce(tensor, op=red)
        return tensor / self.world_size if op == "mean" else tensor

    def any(self, flag: bool) -> bool:
        t = torch.tensor(1.0 if flag else 0.0, device=self.root_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def all(self, flag: bool) -> bool:
        t = torch.tensor(1.0 if flag else 0.0, device=self.root_device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t.item())

    def broadcast_flag(self, flag: bool) -> bool:
        """Global rank 0's ``flag`` on every rank."""
        t = torch.tensor(1.0 if flag else 0.0, device=self.root_device)
        dist.broadcast(t, src=0)
        return bool(t.item())

    def barrier(self) -> None:
        if dist.is_initialized():  # a strategy object outside its ranks (before a launch) has no one to wait for
            dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s picklable ``obj`` on every rank (``obj`` itself outside a group)."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def teardown(self) -> None:
        if self._sync_state is not None:
            self._sync_state.close()
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False
        super().teardown()

    def describe(self) -> dict[str, Any]:
        return {"strategy": "ddp", "device": str(self.root_device), "world_size": self.world_size,
                "num_nodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")), "grad_sync": self.comm_hook,
                "backend": self.backend}


class _SkipInit(TorchFunctionMode):
    """``torch.nn.init`` functions return their tensor untouched: weights loaded next need no initialization."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)


@contextlib.contextmanager
def init_context(device: torch.device, empty_init: bool | None = None) -> Any:
    """Tensors created inside land on ``device``; ``empty_init=True`` also skips their initialization."""
    with device, (_SkipInit() if empty_init else contextlib.nullcontext()):
        yield
