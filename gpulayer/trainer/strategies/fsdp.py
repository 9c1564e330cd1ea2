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

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from gpulayer.trainer import allocator, data
from gpulayer.trainer.errors import TrainerConfigError
from gpulayer.trainer.strategies.fsdp_plan import ShardingPlan, fsdp_plan, mesh_layout, model_parallel_plan
from gpulayer.trainer.strategies.strategy import DDPStrategy

# the module's methods that run its forward: FSDP's hooks run around each, as around ``forward``
_STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")


class FSDPStrategy(DDPStrategy):
    """Lightning's ``FSDPStrategy`` on FSDP2; see ``fsdp_plan.py`` for the arguments honoured and refused.

    >>> Trainer(strategy=FSDPStrategy(auto_wrap_policy={Block}, state_dict_type="sharded"),
    ...         accelerator="cpu", devices=2)                                                     # doctest: +SKIP
    """

    strategy_name = "fsdp"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args:
            raise TypeError(f"{type(self).__name__} takes keyword arguments only (got {len(args)} positional)")
        self._init_plan(fsdp_plan(**kwargs))

    def _init_plan(self, plan: ShardingPlan, device: torch.device | None = None, planned_world_size: int = 1,
                   num_nodes: int = 1) -> None:
        super().__init__(device, grad_sync="flat", timeout_s=plan.timeout_s, planned_world_size=planned_world_size)
        self.sharding_plan = plan
        self.num_nodes = num_nodes
        self.device_mesh: Any = None
        self._failed = False
        self._final_state_dict: dict[str, torch.Tensor] | None = None

    @classmethod
    def for_rank(cls, plan: ShardingPlan, device: torch.device | None, planned_world_size: int,
                 num_nodes: int) -> "FSDPStrategy":
        """The live strategy of one rank, from the plan the caller's config carried."""
        strategy = cls.__new__(ModelParallelStrategy if plan.kind == "model_parallel" else FSDPStrategy)
        strategy._init_plan(plan, device, planned_world_size, num_nodes)
        return strategy

    # -- process group and mesh -----------------------------------------------------------------
    def setup_environment(self) -> None:
        if not dist.is_initialized() and self.world_size == 1 and "MASTER_ADDR" not in os.environ:
            # devices=1 runs in the caller's process: a group of one, without a rendezvous
            backend = self.sharding_plan.backend or ("nccl" if self.root_device.type == "cuda" else "gloo")
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            self._owns_group = True
        elif not dist.is_initialized() and self.sharding_plan.backend is not None:
            import datetime
            dist.init_process_group(self.sharding_plan.backend,
                                    timeout=datetime.timedelta(seconds=self.timeout_s))
            self._owns_group = True
        super().setup_environment()
        if self.root_device.type == "cpu":
            allocator.return_freed_memory()  # memory is what sharding is for: freed layers go back at once
        from torch.distributed.device_mesh import init_device_mesh
        shape, names = mesh_layout(self.sharding_plan, self.world_size,
                                   int(os.environ.get("GROUP_WORLD_SIZE", self.num_nodes)))
        self.device_mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=names)

    @property
    def _shard_mesh(self) -> Any:
        """The mesh ``fully_shard`` gets: the data-parallel dimension of a 2-D model-parallel mesh, else all of it."""
        if self.sharding_plan.kind == "model_parallel":
            return self.device_mesh["data_parallel"]
        return self.device_mesh

    def _data_rank(self) -> tuple[int, int]:
        """(data-parallel size, this rank's place in it): ranks of one tensor-parallel group read the same batch."""
        if self.sharding_plan.kind == "model_parallel" and self.device_mesh is not None:
            dp = self.device_mesh["data_parallel"]
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
        _checkpoint_activations(module, plan.checkpoint_classes)
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

    def save_checkpoint(self, ckpt: dict[str, Any], path: str, storage_options: Any = None) -> None:
        if not self._live():  # the caller's whole module after the run: an ordinary file
            return super().save_checkpoint(ckpt, path)
        from gpulayer.trainer.strategies import fsdp_checkpoint
        fsdp_checkpoint.save(self, ckpt, path)

    def load_checkpoint(self, path: str, weights_only: bool | None = None) -> dict[str, Any]:
        from gpulayer.trainer.strategies import fsdp_checkpoint
        return fsdp_checkpoint.load(self, path)

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
        shape = tuple(self.device_mesh.shape) if self.device_mesh is not None else None
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
                 timeout: Any = None) -> None:
        self._init_plan(model_parallel_plan(data_parallel_size, tensor_parallel_size, save_distributed_checkpoint,
                                            process_group_backend, timeout))


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
    holds the whole model."""
    module.to_empty(device=device)
    with torch.no_grad():
        for sub in module.modules():
            reset = getattr(sub, "reset_parameters", None)
            if callable(reset):
                reset()


def _checkpoint_activations(module: nn.Module, classes: tuple[type, ...]) -> None:
    """Recompute these layers' activations in backward (``torch.utils.checkpoint``) instead of keeping them."""
    if not classes:
        return
    from torch.utils.checkpoint import checkpoint

    def run(forward: Any, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    for sub in module.modules():
        if isinstance(sub, classes) and not getattr(sub, "_gpulayer_checkpointed", False):
            sub.forward = functools.partial(run, sub.forward)
            sub._gpulayer_checkpointed = True
