"""Lightning's ``FSDPStrategy(...)`` / ``ModelParallelStrategy(...)`` arguments, read into one plain plan.

A strategy object is built in the caller's process, where no rank runs yet; what
travels to the ranks (inside ``TrainerConfig``) is this frozen, picklable plan,
and each rank builds its live strategy from it (``fsdp.py``). Every argument
Lightning documents is either honoured here on FSDP2 (``fully_shard``) or refused
with what to do instead: an argument that was accepted and ignored would change a
run without a word.

Honoured (FSDPStrategy): ``process_group_backend``, ``timeout``, ``sharding_strategy``
(``FULL_SHARD``, ``SHARD_GRAD_OP``, ``HYBRID_SHARD``, ``_HYBRID_SHARD_ZERO2``, and ``NO_SHARD``: a
``(world, 1)`` mesh, every rank holding all parameters and all-reducing gradients, as DDP),
``state_dict_type`` (``"full"``: one file written by rank 0; ``"sharded"``: a
``torch.distributed.checkpoint`` directory; any other value fails when a Trainer takes the strategy or a
checkpoint is saved, with Lightning's "Unknown state_dict_type"), ``auto_wrap_policy`` and
``activation_checkpointing_policy`` (a set or list of module classes, FSDP1's ``ModuleWrapPolicy``, or a
``policy(module, recurse, nonwrapped_numel)`` callable), the deprecated ``activation_checkpointing``
(module classes, with Lightning's deprecation warning), ``mixed_precision`` (FSDP2's ``MixedPrecisionPolicy``,
or FSDP1's ``MixedPrecision`` with only ``param_dtype`` / ``reduce_dtype`` set), ``cpu_offload`` (a bool or
FSDP1's ``CPUOffload``; CUDA only), ``device_mesh`` (a ``(replicate, shard)`` tuple), ``use_orig_params``
(FSDP2 always keeps the original parameters: ``False`` warns that it changes nothing), and ``checkpoint_io`` /
``precision_plugin`` (kept on the strategy object, which the Trainer reads as it reads ``plugins=``; the
precision must be an ``FSDPPrecision``, as in Lightning).
Honoured (ModelParallelStrategy): all of its arguments.
Refused: ``accelerator``, ``parallel_devices``, ``cluster_environment`` (the Trainer's ``accelerator``,
``devices``, ``num_nodes`` and ``plugins`` say these), a ``DeviceMesh`` object (it cannot travel to the
ranks), and every other FSDP1 keyword.
"""

from __future__ import annotations

import datetime
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from gpulayer.trainer.errors import DeviceMeshMismatch, TrainerConfigError

_SHARDING = {  # Lightning's names -> (reshard after forward, hybrid: replicate across machines)
    "FULL_SHARD": (True, False), "SHARD_GRAD_OP": (False, False),
    "HYBRID_SHARD": (True, True), "_HYBRID_SHARD_ZERO2": (False, True), "NO_SHARD": (False, True),
}
_TRAINER_OWNS = {"accelerator": "accelerator", "parallel_devices": "devices", "cluster_environment": "plugins"}
STATE_DICT_TYPES = ("full", "sharded")


@dataclass(frozen=True)
class ShardingPlan:
    """What a rank needs to shard the module, make its mesh and write its checkpoints."""

    kind: str = "fsdp"                     # "fsdp" (gpulayer wraps) or "model_parallel" (configure_model wraps)
    state_dict_type: str = "full"          # "full" | "sharded"
    reshard_after_forward: bool = True
    hybrid: bool = False                   # HSDP: shard inside a machine, replicate across machines
    no_shard: bool = False                 # NO_SHARD: a (world, 1) mesh, every rank replicates everything
    mesh_shape: tuple[int, int] | None = None  # (replicate, shard) given by the user
    wrap_classes: tuple[type, ...] = ()
    wrap_policy: Callable[..., bool] | None = None
    checkpoint_classes: tuple[type, ...] = ()
    checkpoint_policy: Callable[..., bool] | None = None
    mixed_precision: Any = None            # torch.distributed.fsdp.MixedPrecisionPolicy
    cpu_offload: bool = False
    backend: str | None = None
    timeout_s: float = 1800.0
    data_parallel_size: int | str = "auto"    # model_parallel only
    tensor_parallel_size: int | str = "auto"  # model_parallel only

    @property
    def name(self) -> str:
        return "fsdp" if self.kind == "fsdp" else "model_parallel"


def _refuse(cls: str, arg: str, value: Any, fix: str) -> TrainerConfigError:
    return TrainerConfigError(f"{cls}({arg}={value!r}) is not supported by gpulayer's FSDP2 strategy; {fix}")


def _classes(cls: str, arg: str, value: Any) -> tuple[type, ...]:
    if value is None:
        return ()
    items = (value,) if isinstance(value, type) else tuple(value) if isinstance(value, (set, frozenset, list, tuple)) else None
    if items is None or not all(isinstance(c, type) and issubclass(c, nn.Module) for c in items):
        raise _refuse(cls, arg, value, "pass a set of nn.Module classes, e.g. {nn.TransformerEncoderLayer}")
    return tuple(sorted(items, key=lambda c: f"{c.__module__}.{c.__qualname__}"))


def _timeout(cls: str, value: Any) -> float:
    if value is None:
        return 1800.0
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    raise _refuse(cls, "timeout", value, "pass a datetime.timedelta")


def _backend(cls: str, value: Any) -> str | None:
    if value not in (None, "gloo", "nccl"):
        raise _refuse(cls, "process_group_backend", value, "use 'gloo' (CPU) or 'nccl' (CUDA), or leave it None")
    return value


def _mixed_precision(value: Any) -> Any:
    if value is None:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy
    if isinstance(value, MixedPrecisionPolicy):
        return value
    from torch.distributed.fsdp import MixedPrecision  # FSDP1's: its two dtypes map, the rest has no FSDP2 twin
    if isinstance(value, MixedPrecision):
        extra = {k: getattr(value, k) for k in ("buffer_dtype", "keep_low_precision_grads", "cast_forward_inputs",
                                                 "cast_root_forward_inputs", "_module_classes_to_ignore")
                 if getattr(value, k) != getattr(MixedPrecision(), k)}
        if extra:
            raise _refuse("FSDPStrategy", "mixed_precision", value, f"FSDP2 has no equivalent of {sorted(extra)}; "
                          "set only param_dtype and reduce_dtype, or pass a torch.distributed.fsdp.MixedPrecisionPolicy")
        return MixedPrecisionPolicy(param_dtype=value.param_dtype, reduce_dtype=value.reduce_dtype)
    raise _refuse("FSDPStrategy", "mixed_precision", value,
                  "pass a torch.distributed.fsdp.MixedPrecisionPolicy, or use Trainer(precision='bf16-mixed')")


def _sharding(value: Any) -> tuple[bool, bool]:
    name = getattr(value, "name", value)  # FSDP1's ShardingStrategy enum, or its name
    if not isinstance(name, str) or name.upper() not in _SHARDING:
        raise _refuse("FSDPStrategy", "sharding_strategy", value, f"accepted: {', '.join(_SHARDING)}")
    return _SHARDING[name.upper()]


def fsdp_plan(*, accelerator: Any = None, parallel_devices: Any = None, cluster_environment: Any = None,
              process_group_backend: str | None = None, timeout: datetime.timedelta | None = None,
              cpu_offload: Any = None, mixed_precision: Any = None, auto_wrap_policy: Any = None,
              activation_checkpointing: Any = None, activation_checkpointing_policy: Any = None,
              sharding_strategy: Any = "FULL_SHARD", state_dict_type: str = "full", device_mesh: Any = None,
              **kwargs: Any) -> ShardingPlan:
    """``FSDPStrategy(...)``'s arguments (Lightning's names and defaults), checked."""
    given = dict(accelerator=accelerator, parallel_devices=parallel_devices, cluster_environment=cluster_environment)
    for arg, value in given.items():
        if value is not None:
            raise _refuse("FSDPStrategy", arg, value, f"leave it out and say it with Trainer({_TRAINER_OWNS[arg]}=...)")
    if activation_checkpointing is not None and activation_checkpointing_policy is not None:
        raise ValueError("You cannot set both `activation_checkpointing` and `activation_checkpointing_policy`. Use "
                         "the latter.")
    if activation_checkpointing is not None:
        classes = _classes("FSDPStrategy", "activation_checkpointing", activation_checkpointing)
        warnings.warn(f"`FSDPStrategy(activation_checkpointing={activation_checkpointing})` is deprecated, use "
                      f"`FSDPStrategy(activation_checkpointing_policy={set(classes)})` instead.", DeprecationWarning,
                      stacklevel=3)
        activation_checkpointing_policy = classes
    if kwargs.pop("use_orig_params", True) is not True:
        warnings.warn("FSDPStrategy(use_orig_params=False): FSDP2 (fully_shard) always keeps the original parameters; "
                      "the optimizer sees them as with use_orig_params=True", UserWarning, stacklevel=3)
    if kwargs:
        name = sorted(kwargs)[0]
        raise _refuse("FSDPStrategy", name, kwargs[name], "it is an FSDP1 constructor argument with no FSDP2 "
                      "(fully_shard) equivalent; remove it")
    reshard, hybrid = _sharding(sharding_strategy)
    no_shard = getattr(sharding_strategy, "name", sharding_strategy).upper() == "NO_SHARD"
    mesh_shape = None
    if device_mesh is not None:
        if not (isinstance(device_mesh, tuple) and len(device_mesh) == 2 and all(isinstance(n, int) and n > 0
                                                                                 for n in device_mesh)):
            raise _refuse("FSDPStrategy", "device_mesh", device_mesh, "pass a (replicate, shard) tuple of sizes: a "
                          "DeviceMesh object cannot travel to the rank processes, which build it themselves")
        mesh_shape, hybrid = device_mesh, True
    wrap_policy, wrap_classes = _policy("auto_wrap_policy", auto_wrap_policy)
    checkpoint_policy, checkpoint_classes = _policy("activation_checkpointing_policy", activation_checkpointing_policy)
    offload = cpu_offload if isinstance(cpu_offload, bool) or cpu_offload is None else \
        bool(getattr(cpu_offload, "offload_params", False))
    return ShardingPlan(
        kind="fsdp", state_dict_type=state_dict_type, reshard_after_forward=reshard, hybrid=hybrid,
        no_shard=no_shard, mesh_shape=mesh_shape, wrap_classes=wrap_classes, wrap_policy=wrap_policy,
        checkpoint_classes=checkpoint_classes, checkpoint_policy=checkpoint_policy,
        mixed_precision=_mixed_precision(mixed_precision), cpu_offload=bool(offload),
        backend=_backend("FSDPStrategy", process_group_backend), timeout_s=_timeout("FSDPStrategy", timeout))


def _policy(arg: str, value: Any) -> tuple[Callable[..., bool] | None, tuple[type, ...]]:
    """(a policy callable, module classes) from a wrap or checkpointing policy; FSDP1's ``ModuleWrapPolicy`` is
    a callable of that signature too."""
    if callable(value) and not isinstance(value, type):
        return value, ()
    return None, _classes("FSDPStrategy", arg, value)


def check_state_dict_type(value: Any) -> None:
    """Lightning's error for a ``state_dict_type`` it does not know (raised where Lightning raises it: when the
    checkpoint is written; gpulayer also raises it when a Trainer takes the strategy, before any rank starts)."""
    if value not in STATE_DICT_TYPES:
        raise ValueError(f"Unknown state_dict_type: {value} (FSDPStrategy(state_dict_type=...) is 'full' or 'sharded')")


def model_parallel_plan(data_parallel_size: int | str = "auto", tensor_parallel_size: int | str = "auto",
                        save_distributed_checkpoint: bool = True, process_group_backend: str | None = None,
                        timeout: datetime.timedelta | None = None) -> ShardingPlan:
    """``ModelParallelStrategy(...)``'s arguments: the module shards itself in ``configure_model`` on
    ``self.device_mesh`` (dimensions ``"data_parallel"`` and ``"tensor_parallel"``)."""
    for arg, value in (("data_parallel_size", data_parallel_size), ("tensor_parallel_size", tensor_parallel_size)):
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise _refuse("ModelParallelStrategy", arg, value, "pass 'auto' or an integer >= 1")
    return ShardingPlan(kind="model_parallel", state_dict_type="sharded" if save_distributed_checkpoint else "full",
                        data_parallel_size=data_parallel_size, tensor_parallel_size=tensor_parallel_size,
                        backend=_backend("ModelParallelStrategy", process_group_backend),
                        timeout_s=_timeout("ModelParallelStrategy", timeout))


def mesh_layout(plan: ShardingPlan, world: int, num_nodes: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The device mesh's shape and dimension names for ``world`` ranks on ``num_nodes`` machines."""
    if plan.kind == "model_parallel":
        # Lightning's "auto": data parallel across machines, tensor parallel inside each
        dp = num_nodes if plan.data_parallel_size == "auto" else plan.data_parallel_size
        tp = world // num_nodes if plan.tensor_parallel_size == "auto" else plan.tensor_parallel_size
        if dp * tp != world:
            raise DeviceMeshMismatch(f"The sizes `data_parallel_size={dp}` and `tensor_parallel_size={tp}` multiplied "
                                     f"should equal the world size ({world}): ModelParallelStrategy(data_parallel_size="
                                     f"{plan.data_parallel_size!r}, tensor_parallel_size={plan.tensor_parallel_size!r})"
                                     f" makes a {dp} x {tp} mesh; choose sizes whose product is {world}")
        return (dp, tp), ("data_parallel", "tensor_parallel")
    if plan.no_shard:
        return (world, 1), ("replicate", "shard")
    if not plan.hybrid:
        return (world,), ("shard",)
    replicate, shard = plan.mesh_shape or (num_nodes, world // num_nodes)
    if replicate * shard != world:
        raise TrainerConfigError(f"FSDPStrategy(device_mesh={plan.mesh_shape!r}) has {replicate * shard} places but "
                                 f"the run has {world} processes; choose (replicate, shard) with that product")
    return (replicate, shard), ("replicate", "shard")


def plan_for(value: Any) -> ShardingPlan | None:
    """The plan a ``Trainer(strategy=...)`` value asks for; None when it is not a sharded strategy."""
    if isinstance(value, str) and value == "fsdp":
        return fsdp_plan()
    plan = getattr(value, "sharding_plan", None)
    if not isinstance(plan, ShardingPlan):
        return None
    check_state_dict_type(plan.state_dict_type)
    return plan
