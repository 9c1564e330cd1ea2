"""FSDP2 in a rank: ``torch.distributed.fsdp.fully_shard`` over a device mesh, on CPU (gloo) as on CUDA (nccl).

``Trainer(strategy="fsdp", accelerator="cpu", devices=2)`` shards every parameter
across the ranks (each holds about 1/W of the model), all-gathers a module's
parameters just before its forward and reduce-scatters the gradients in backward.
Lightning refuses FSDP on CPU (lightning#21812); here the same code path runs on a
fleet of CPU machines, and FSDP code is testable without GPUs.

The ranks are started as for DDP (``launcher.py`` on one machine, ``cluster.py``
for ``num_nodes > 1``); this strategy differs from ``DDPStrategy`` in what it does
with the module, the gradient sync of accumulation and the checkpoints
(``fsdp_checkpoint.py``). The arguments Lightning's ``FSDPStrategy`` and
``ModelParallelStrategy`` take are read in ``fsdp_plan.py``.

Wrapping: with ``ModelParallelStrategy`` the module applies ``fully_shard`` (and
tensor parallelism) itself in ``configure_model``, on ``self.device_mesh``, as
Lightning documents. With ``FSDPStrategy`` a module that did so in
``configure_model`` is kept as it is; otherwise each submodule that
``auto_wrap_policy`` names is sharded on its own, then the root. Parameters left
outside every sharded module are sharded with the root, so none escapes the
gradient sync.
"""

# no `from __future__ import annotations`: jsonargparse (LightningCLI) reads the signatures' real types

import contextlib
import datetime
import functools
import itertools
import os
import shutil
import warnings
from typing import Any, Iterator, Optional, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from gpulayer.trainer import allocator, data
from gpulayer.trainer.errors import TrainerConfigError
from gpulayer.trainer.strategies.fsdp_plan import ShardingPlan, fsdp_plan, mesh_layout, model_parallel_plan
from gpulayer.trainer.strategies.strategy import DDPStrategy, Strategy

_DEFAULT_TIMEOUT = datetime.timedelta(seconds=1800)  # torch's default process-group timeout, as Lightning's

# the module's methods that run its forward: FSDP's hooks run around each, as around ``forward``
_STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")


class FSDPStrategy(DDPStrategy):
    """Lightning's ``FSDPStrategy`` on FSDP2; see ``fsdp_plan.py`` for the arguments honoured and refused.

    The Lightning-facing attributes (``sharding_strategy``, ``cpu_offload``, ``mixed_precision``,
    ``mixed_precision_config``, ``kwargs``, ``precision_plugin``, ``checkpoint_io``) read as Lightning's do;
    what travels to the ranks is ``sharding_plan``.

    >>> Trainer(strategy=FSDPStrategy(auto_wrap_policy={Block}, state_dict_type="sharded"),
    ...         accelerator="cpu", devices=2)                                                     # doctest: +SKIP
    """

    strategy_name = "fsdp"

    def __init__(self, accelerator: Any = None, parallel_devices: Any = None, cluster_environment: Any = None,
                 checkpoint_io: Any = None, precision_plugin: Any = None, process_group_backend: str | None = None,
                 timeout: datetime.timedelta | None = _DEFAULT_TIMEOUT, cpu_offload: Any = None,
                 mixed_precision: Any = None, auto_wrap_policy: Any = None, activation_checkpointing: Any = None,
                 activation_checkpointing_policy: Any = None, sharding_strategy: Any = "FULL_SHARD",
                 state_dict_type: str = "full",
                 device_mesh: Optional[Union[tuple[int, int], DeviceMesh]] = None, **kwargs: Any) -> None:
        from torch.distributed.fsdp import CPUOffload, ShardingStrategy

        plan = fsdp_plan(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, process_group_backend=process_group_backend,
                         timeout=timeout, cpu_offload=cpu_offload, mixed_precision=mixed_precision,
                         auto_wrap_policy=auto_wrap_policy, activation_checkpointing=activation_checkpointing,
                         activation_checkpointing_policy=activation_checkpointing_policy,
                         sharding_strategy=sharding_strategy, state_dict_type=state_dict_type,
                         device_mesh=device_mesh, **kwargs)
        self._init_plan(plan)
        # Lightning's attributes, as given (FSDP1's types where Lightning has them)
        self.checkpoint_io = checkpoint_io
        self.precision_plugin = precision_plugin
        self._timeout = timeout
        self.cpu_offload = cpu_offload if isinstance(cpu_offload, CPUOffload) else \
            CPUOffload(offload_params=bool(cpu_offload))
        self.mixed_precision = mixed_precision
        self.sharding_strategy = ShardingStrategy[sharding_strategy.upper()] if isinstance(sharding_strategy, str) \
            else sharding_strategy
        self.kwargs = {**kwargs, "use_orig_params": kwargs.get("use_orig_params", True)}
        if auto_wrap_policy is not None:
            self.kwargs["auto_wrap_policy"] = _as_wrap_policy(auto_wrap_policy)
        if device_mesh is not None:
            self.kwargs["device_mesh"] = device_mesh
        self._activation_checkpointing_kwargs = {} if activation_checkpointing_policy is None and \
            activation_checkpointing is None else \
            {"auto_wrap_policy": _as_wrap_policy(activation_checkpointing_policy or plan.checkpoint_classes)}

    def _init_plan(self, plan: ShardingPlan, device: torch.device | None = None, planned_world_size: int = 1,
                   num_nodes: int = 1) -> None:
        super().__init__(device, grad_sync="flat", timeout_s=plan.timeout_s, planned_world_size=planned_world_size,
                         process_group_backend=plan.backend)
        self.sharding_plan = plan
        self._state_dict_type = plan.state_dict_type
        # Lightning's attributes as the plan says them (the constructor replaces them with the objects given)
        from torch.distributed.fsdp import CPUOffload, ShardingStrategy
        self.sharding_strategy = ShardingStrategy[_sharding_name(plan)]
        self.cpu_offload = CPUOffload(offload_params=plan.cpu_offload)
        self.mixed_precision = plan.mixed_precision
        self.kwargs: dict[str, Any] = {"use_orig_params": True}
        self._activation_checkpointing_kwargs: dict[str, Any] = {}
        self._timeout = datetime.timedelta(seconds=plan.timeout_s)
        self.num_nodes = num_nodes
        self._device_mesh: Any = None
        self._failed = False
        self._final_state_dict: dict[str, torch.Tensor] | None = None

    @classmethod
    def for_rank(cls, plan: ShardingPlan, device: torch.device | None, planned_world_size: int,
                 num_nodes: int) -> "FSDPStrategy":
        """The live strategy of one rank, from the plan the caller's config carried."""
        strategy = cls.__new__(ModelParallelStrategy if plan.kind == "model_parallel" else FSDPStrategy)
        strategy._init_plan(plan, device, planned_world_size, num_nodes)
        return strategy

    # -- Lightning's view of the strategy ----------------------------------------------------------
    @property
    def lightning_module(self) -> Any:
        return self._lightning_module

    @lightning_module.setter
    def lightning_module(self, module: Any) -> None:
        self._lightning_module = module

    @property
    def device_mesh(self) -> Any:
        """The run's ``DeviceMesh`` (None before the process group exists)."""
        return self._device_mesh

    @property
    def process_group_backend(self) -> str | None:
        return self.sharding_plan.backend

    @property
    def precision_plugin(self) -> Any:
        """An ``FSDPPrecision`` (``"32-true"`` unless one was given), as Lightning's FSDPStrategy requires."""
        from gpulayer.trainer.plugins.precision import FSDPPrecision
        return self._precision_plugin if self._precision_plugin is not None else FSDPPrecision("32-true")

    @precision_plugin.setter
    def precision_plugin(self, plugin: Any) -> None:
        from gpulayer.trainer.plugins.precision import FSDPPrecision
        if plugin is not None and not isinstance(plugin, FSDPPrecision):
            raise TypeError(f"The FSDP strategy can only work with the `FSDPPrecision` plugin, found {plugin}")
        self._precision_plugin = plugin

    @property
    def mixed_precision_config(self) -> Any:
        """The ``mixed_precision`` given, else the precision plugin's ``MixedPrecision`` config."""
        if self.mixed_precision:
            return self.mixed_precision
        return getattr(self.precision_plugin, "mixed_precision_config", None)

    # -- process group and mesh -----------------------------------------------------------------
    def setup_environment(self) -> None:
        self._setup_distributed()
        world = self.world_size if self._cluster_environment is None else self._cluster_environment.world_size()
        shape, names = mesh_layout(self.sharding_plan, world, int(os.environ.get("GROUP_WORLD_SIZE", self.num_nodes)))
        from torch.distributed.device_mesh import init_device_mesh
        self._device_mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=names)

    def _setup_distributed(self) -> None:
        """The process group (Lightning's step of the same name): a group of one in the caller's process for
        ``devices=1``, else the launched ranks' group (``DDPStrategy``), with the backend asked for."""
        if not dist.is_initialized() and self.world_size == 1 and "MASTER_ADDR" not in os.environ:
            # devices=1 runs in the caller's process: a group of one, without a rendezvous
            backend = self.sharding_plan.backend or ("nccl" if self.root_device.type == "cuda" else "gloo")
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            self._owns_group = True
        elif not dist.is_initialized() and self.sharding_plan.backend is not None:
            dist.init_process_group(self.sharding_plan.backend,
                                    timeout=datetime.timedelta(seconds=self.timeout_s))
            self._owns_group = True
        super().setup_environment()
        if self.root_device.type == "cpu":
            allocator.return_freed_memory()  # memory is what sharding is for: freed layers go back at once

    @property
    def _shard_mesh(self) -> Any:
        """The mesh ``fully_shard`` gets: the data-parallel dimension of a 2-D model-parallel mesh, else all of it."""
        if self.sharding_plan.kind == "model_parallel":
            return self._device_mesh["data_parallel"]
        return self._device_mesh

    def _data_rank(self) -> tuple[int, int]:
        """(data-parallel size, this rank's place in it): ranks of one tensor-parallel group read the same batch."""
        if self.sharding_plan.kind == "model_parallel" and self._device_mesh is not None:
            dp = self._device_mesh["data_parallel"]
            return dp.size(), dp.get_local_rank()
        return self.world_size, self.global_rank

    def prepare_loader(self, loader: Any, mode: str = "train") -> Any:
        size, rank = self._data_rank()
        return data.distributed(loader, size, rank, mode)

    # -- the module -------------------------------------------------------------------------------
    def setup_module(self, module: nn.Module) -> Any:
        self._shard(module)
        return module.training_step

    def setup_eval_module(self, module: nn.Module) -> None:
        self._shard(module)

    def _shard(self, module: nn.Module) -> None:
        from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

        module._device = self.root_device
        self.model = self.lightning_module = module
        if isinstance(module, FSDPModule):
            return  # a second stage of the same run (validate after fit): already sharded
        plan = self.sharding_plan
        sharded_by_user = any(isinstance(p, _dtensor_type()) for p in module.parameters())
        if plan.kind == "model_parallel" and not sharded_by_user:
            raise TypeError(
                f"When using the {type(self).__name__}, you are required to override the `configure_model()` hook in "
                "the LightningModule and apply parallelization there (fully_shard(layer, mesh=self.device_mesh"
                "['data_parallel']) for each layer, then for the module); or use Trainer(strategy='fsdp'), which "
                "wraps the module itself")
        on_meta = any(p.device.type == "meta" for p in module.parameters())
        if not sharded_by_user and not on_meta:
            module.to(self.root_device)
        kw: dict[str, Any] = {"mesh": self._shard_mesh, "reshard_after_forward": plan.reshard_after_forward}
        if plan.mixed_precision is not None:
            kw["mp_policy"] = plan.mixed_precision
        if plan.cpu_offload:
            if self.root_device.type != "cuda":
                raise TrainerConfigError("FSDPStrategy(cpu_offload=True) moves parameters from GPU memory to CPU "
                                         "memory; with accelerator='cpu' they are there already: remove cpu_offload")
            from torch.distributed.fsdp import CPUOffloadPolicy
            kw["offload_policy"] = CPUOffloadPolicy()
        _checkpoint_activations(module, plan.checkpoint_classes, plan.checkpoint_policy)
        if not sharded_by_user:
            for sub in _to_wrap(module, plan):
                fully_shard(sub, **kw)
        if not isinstance(module, FSDPModule):
            # the root's own parameters (and any the user's configure_model left out) join the sync here
            fully_shard(module, **kw)
        if on_meta:
            _materialize(module, self.root_device)
        for name in _STEP_METHODS:
            if callable(getattr(type(module), name, None)):
                register_fsdp_forward_method(module, name)

    def no_sync(self) -> contextlib.AbstractContextManager:
        return self._accumulating()

    @contextlib.contextmanager
    def _accumulating(self) -> Iterator[None]:
        """Micro-batches that do not step keep their unsharded gradients; the stepping one reduce-scatters."""
        roots = _fsdp_modules(self.lightning_module)
        for m in roots:
            m.set_requires_gradient_sync(False, recurse=False)
        try:
            yield
        finally:
            for m in roots:
                m.set_requires_gradient_sync(True, recurse=False)

    # -- checkpoints ------------------------------------------------------------------------------
    def _live(self) -> bool:
        """Inside the run's ranks, with the module sharded (not the caller's trainer before or after them)."""
        return dist.is_initialized() and bool(_fsdp_modules(self.lightning_module))

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """Lightning's rules: ``"full"`` writes one file through ``checkpoint_io`` (replacing a sharded directory of
        the same name, refusing any other directory); ``"sharded"`` writes a directory (replacing a file)."""
        from gpulayer.trainer.strategies import fsdp_checkpoint
        from gpulayer.trainer.strategies.fsdp_plan import check_state_dict_type
        name = type(self).__name__
        if storage_options is not None:
            raise TypeError(f"`{name}.save_checkpoint(..., storage_options=...)` is not supported because `{name}` "
                            "does not use the `CheckpointIO`.")
        check_state_dict_type(self._state_dict_type)
        path = os.fspath(self.broadcast(filepath))
        if not self._live():  # the caller's whole module after the run: an ordinary file
            fsdp_checkpoint.clear_for_file(path, self.is_global_zero)
            return super().save_checkpoint(checkpoint, path)
        fsdp_checkpoint.save(self, checkpoint, path)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        from gpulayer.trainer.strategies import fsdp_checkpoint
        return fsdp_checkpoint.load(self, os.fspath(self.broadcast(checkpoint_path)), weights_only)

    def load_optimizer_state(self, optimizer: Any, state: Any) -> None:
        if not self._live():
            return super().load_optimizer_state(optimizer, state)
        from gpulayer.trainer.strategies import fsdp_checkpoint
        fsdp_checkpoint.load_optimizer(self, optimizer, state)

    def remove_checkpoint(self, path: str) -> None:
        from gpulayer.trainer.strategies import fsdp_checkpoint
        if self.is_global_zero:
            fsdp_checkpoint.remove(path)

    def lightning_module_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights (on global rank 0 after the run; gathered at teardown, while the group lives)."""
        if self._final_state_dict is not None:
            return self._final_state_dict
        if not self._live():
            return super().lightning_module_state_dict()
        from gpulayer.trainer.strategies import fsdp_checkpoint
        return fsdp_checkpoint.full_model_state(self.lightning_module)

    def on_exception(self, exception: BaseException) -> None:
        self._failed = True  # the other ranks may be gone: no collective at teardown

    def teardown(self) -> None:
        if not self._failed and self._live():
            from gpulayer.trainer.strategies import fsdp_checkpoint
            self._final_state_dict = fsdp_checkpoint.full_model_state(self.lightning_module)
        super().teardown()

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        shape = tuple(self._device_mesh.shape) if self._device_mesh is not None else None
        return {**info, "strategy": self.strategy_name, "grad_sync": "reduce_scatter", "mesh": shape,
                "state_dict_type": self.sharding_plan.state_dict_type}


class ModelParallelStrategy(FSDPStrategy):
    """Lightning's ``ModelParallelStrategy``: the module parallelizes itself in ``configure_model``.

    >>> class Net(Module):
    ...     def configure_model(self):
    ...         for block in self.blocks:
    ...             fully_shard(block, mesh=self.device_mesh["data_parallel"])
    ...         fully_shard(self, mesh=self.device_mesh["data_parallel"])
    >>> Trainer(strategy=ModelParallelStrategy(), accelerator="cpu", devices=2)               # doctest: +SKIP
    """

    strategy_name = "model_parallel"

    def __init__(self, data_parallel_size: int | str = "auto", tensor_parallel_size: int | str = "auto",
                 save_distributed_checkpoint: bool = True, process_group_backend: str | None = None,
                 timeout: datetime.timedelta | None = _DEFAULT_TIMEOUT) -> None:
        self._init_plan(model_parallel_plan(data_parallel_size, tensor_parallel_size, save_distributed_checkpoint,
                                            process_group_backend, timeout))
        self._timeout = timeout

    @property
    def device_mesh(self) -> Any:
        """The 2-D ``("data_parallel", "tensor_parallel")`` mesh ``configure_model`` parallelizes on."""
        if self._device_mesh is None:
            raise RuntimeError("Accessing the device mesh before processes have initialized is not allowed.")
        return self._device_mesh

    @property
    def precision_plugin(self) -> Any:  # any precision plugin (Lightning's ModelParallelStrategy takes them all)
        return Strategy.precision_plugin.fget(self)

    @precision_plugin.setter
    def precision_plugin(self, plugin: Any) -> None:
        self._precision_plugin = plugin

    def setup(self, trainer: Any) -> None:
        """Lightning's checks on the module before a run, and meta-device parameters materialized on this rank's
        device (the rank's own setup runs them in ``setup_module``)."""
        module = self.lightning_module
        _require_configure_model(self, module)
        from torch.distributed.fsdp import FullyShardedDataParallel
        if any(isinstance(m, FullyShardedDataParallel) for m in self.model.modules()):
            raise TypeError("Found modules that are wrapped with `torch.distributed.fsdp.FullyShardedDataParallel`. "
                            f"The `{type(self).__name__}` only supports the new FSDP2 APIs in PyTorch >= 2.4 "
                            "(torch.distributed.fsdp.fully_shard).")
        if any(t.is_meta for t in itertools.chain(module.parameters(), module.buffers())):
            _materialize(module, self.root_device)
        self.model = self.precision_plugin.convert_module(self.model)
        self.barrier()


def _sharding_name(plan: ShardingPlan) -> str:
    if plan.no_shard:
        return "NO_SHARD"
    if plan.hybrid:
        return "HYBRID_SHARD" if plan.reshard_after_forward else "_HYBRID_SHARD_ZERO2"
    return "FULL_SHARD" if plan.reshard_after_forward else "SHARD_GRAD_OP"


def _require_configure_model(strategy: FSDPStrategy, module: Any) -> None:
    from gpulayer.trainer.utilities.model_helpers import is_overridden
    if not is_overridden("configure_model", module):
        raise TypeError(f"When using the {type(strategy).__name__}, you are required to override the "
                        "`configure_model()` hook in the LightningModule and apply parallelization there.")


def _as_wrap_policy(value: Any) -> Any:
    """Lightning's ``kwargs["auto_wrap_policy"]``: module classes become FSDP1's ``ModuleWrapPolicy``."""
    if isinstance(value, (set, frozenset, list, tuple)) or isinstance(value, type):
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        return ModuleWrapPolicy({value} if isinstance(value, type) else set(value))
    return value


def strategy_for(plan: ShardingPlan, config: Any, device: torch.device | None) -> FSDPStrategy:
    """The FSDP strategy of this process for a ``TrainerConfig`` whose strategy is sharded."""
    return FSDPStrategy.for_rank(plan, device, config.devices * config.num_nodes, config.num_nodes)


def _dtensor_type() -> type:
    from torch.distributed.tensor import DTensor
    return DTensor


def _fsdp_modules(module: nn.Module | None) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule
    return [m for m in module.modules() if isinstance(m, FSDPModule)] if module is not None else []


def _to_wrap(module: nn.Module, plan: ShardingPlan) -> list[nn.Module]:
    """Submodules to shard on their own (children before parents, as ``fully_shard`` wants), never the root."""
    chosen = []
    for name, sub in module.named_modules():
        if sub is module:
            continue
        if plan.wrap_classes and isinstance(sub, plan.wrap_classes):
            chosen.append(sub)
        elif plan.wrap_policy is not None:
            numel = sum(p.numel() for p in sub.parameters())
            if plan.wrap_policy(module=sub, recurse=False, nonwrapped_numel=numel):
                chosen.append(sub)
    return chosen[::-1]  # named_modules lists parents first


def _materialize(module: nn.Module, device: torch.device) -> None:
    """Layers built on the meta device (``configure_model`` under ``torch.device("meta")``): each rank
    allocates only its shards, then every submodule's ``reset_parameters`` initializes them. No rank ever
    holds the whole model. Modules with tensors but no ``reset_parameters`` are named in a warning."""
    module.to_empty(device=device)
    uninitialized = set()
    with torch.no_grad():
        for sub in module.modules():
            if not any(True for _ in itertools.chain(sub.parameters(recurse=False), sub.buffers(recurse=False))):
                continue
            reset = getattr(sub, "reset_parameters", None)
            if callable(reset):
                reset()
            else:
                uninitialized.add(type(sub).__name__)
    if uninitialized:
        warnings.warn("Parameter initialization incomplete. The following modules have parameters or buffers with "
                      "uninitialized memory because they don't define a `reset_parameters()` method for "
                      f"re-initialization: {', '.join(sorted(uninitialized))}", UserWarning, stacklevel=3)


def _checkpoint_activations(module: nn.Module, classes: tuple[type, ...], policy: Any = None) -> None:
    """Recompute these layers' activations in backward (``torch.utils.checkpoint``) instead of keeping them: the
    layers of ``classes``, or those a ``policy(module, recurse, nonwrapped_numel)`` callable chooses."""
    if not classes and policy is None:
        return
    from torch.utils.checkpoint import checkpoint

    def run(forward: Any, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    for sub in module.modules():
        if sub is module or getattr(sub, "_gpulayer_checkpointed", False):
            continue
        chosen = isinstance(sub, classes) if classes else \
            policy(module=sub, recurse=False, nonwrapped_numel=sum(p.numel() for p in sub.parameters()))
        if chosen:
            sub.forward = functools.partial(run, sub.forward)
            sub._gpulayer_checkpointed = True
