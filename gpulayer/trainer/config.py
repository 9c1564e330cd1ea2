"""Trainer arguments: Lightning's names, validated once into a plain, picklable config.

The config travels to every rank of a multi-process fit (see ``fit_rank``), so it
holds only values and picklable objects (callbacks, logger), never live state.
"""

from __future__ import annotations

import ast
import datetime as _dt
import difflib
import os
from dataclasses import dataclass, field
from typing import Any

from gpulayer.trainer.errors import MisconfigurationException, TrainerConfigError, TrainerTypeError
from gpulayer.trainer.utilities.enums import GradClipAlgorithmType

PRECISIONS = {
    "32-true": "32-true", "32": "32-true", 32: "32-true",
    "16-mixed": "16-mixed", "16": "16-mixed", 16: "16-mixed",
    "bf16-mixed": "bf16-mixed", "bf16": "bf16-mixed",
    "64-true": "64-true", "64": "64-true", 64: "64-true",
    "16-true": "16-true", "bf16-true": "bf16-true",
}
# "ddp" and "ddp_spawn" are one launcher: the calling process starts fresh rank processes (launcher.py) and gets
# rank 0's weights, counters and metrics back, which is what Lightning's ddp_spawn does (its "ddp" re-runs the script)
STRATEGIES = ("auto", "single_device", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true", "fsdp")
GRAD_SYNC = ("auto", "two_level", "flat")
CLIP_ALGORITHMS = ("norm", "value")
LOGGER_METHODS = ("log_metrics", "log_hyperparams", "log_graph", "save", "finalize")


@dataclass
class TrainerConfig:
    """Everything a rank needs to run a fit, validated (see ``Trainer`` for meanings)."""

    max_epochs: int = 1000
    max_steps: int = -1
    max_time: float | None = None  # seconds
    min_epochs: int | None = None
    min_steps: int | None = None
    limit_train_batches: int | float = 1.0
    limit_val_batches: int | float = 1.0
    limit_test_batches: int | float = 1.0
    limit_predict_batches: int | float = 1.0
    overfit_batches: int | float = 0.0
    reload_dataloaders_every_n_epochs: int = 0
    inference_mode: bool = True
    use_distributed_sampler: bool = True
    enable_model_summary: bool = True
    fast_dev_run: int | bool = False
    precision: str = "32-true"  # the precision plugin's name (``precision_plugin.precision``)
    precision_plugin: Any = None  # the plugins.precision.Precision every stage runs with (trainer.precision_plugin)
    checkpoint_io: Any = None  # a plugins.io.CheckpointIO given (plugins=, or on a strategy object); None: the default
    sync_batchnorm: bool = False  # a multi-process run turns BatchNorm layers into SyncBatchNorm (plugins.layer_sync)
    layer_sync: Any = None  # the plugins.layer_sync.LayerSync a DDP run applies (sync_batchnorm=True or plugins=)
    cluster_environment: Any = None  # a plugins.environments.ClusterEnvironment given in plugins=; None: detected
    accelerator: str = "cpu"  # the device kind the strategies use: "cpu" or "cuda"
    accelerator_object: Any = None  # the Accelerator (accelerators/) that resolved it: trainer.accelerator
    devices: int = 1
    device_ids: list[int] | None = None
    num_nodes: int = 1
    strategy: str = "auto"
    benchmark: bool = True
    deterministic: bool | str = False
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str | None = None  # None: "norm" when clipping (Lightning's default)
    accumulate_grad_batches: int = 1
    check_val_every_n_epoch: int | None = 1
    val_check_interval: int | float = 1.0
    log_every_n_steps: int = 50
    num_sanity_val_steps: int = 2
    callbacks: list = field(default_factory=list)
    loggers: list = field(default_factory=list)
    enable_checkpointing: bool = True
    enable_progress_bar: bool = False
    default_root_dir: str = "."
    prefetch: bool = True
    grad_sync: str = "auto"
    cluster_resources: Any = None  # num_nodes > 1: gpulayer.Resources (or a dict) every rank's worker must offer
    max_restarts: int = 0  # num_nodes > 1: restarts of the whole gang after a rank or worker fails (gpulayer)
    priority: int = 0  # num_nodes > 1: the gang's priority, 0-9, higher wins and may preempt (gpulayer)
    max_epochs_given: bool = True  # False: max_epochs was derived (Lightning reports None until a fit resolves it)
    detect_anomaly: bool = False  # autograd's anomaly detection around every stage (slow: a debugging aid)
    barebones: bool = False  # every feature that costs speed off (barebones.py)
    profiler: Any = None  # a profilers.Profiler; None: PassThroughProfiler (nothing recorded, nothing paid)
    sharding: Any = None  # strategy "fsdp" / "model_parallel": the fsdp_plan.ShardingPlan every rank builds from
    process_group_backend: str | None = None  # DDPStrategy(process_group_backend=...); None: nccl on CUDA, else gloo

    @property
    def multi_process(self) -> bool:
        return self.devices * self.num_nodes > 1


def _choices_error(name: str, value: Any, accepted) -> TrainerConfigError:
    shown = ", ".join(repr(a) for a in accepted)
    return TrainerConfigError(f"Trainer({name}={value!r}) is not supported; accepted values: {shown}")


def _strategy_name(value: Any) -> Any:
    """A strategy object (``strategy=DDPStrategy()``, as Lightning accepts) becomes the name it stands for."""
    from gpulayer.trainer.strategies import DDPStrategy, SingleDeviceStrategy
    if isinstance(value, DDPStrategy):
        return "ddp_find_unused_parameters_true" if value.find_unused_parameters else "ddp"
    if isinstance(value, SingleDeviceStrategy):
        return "single_device"
    if isinstance(value, str):  # Lightning's names are case-insensitive; find_unused_parameters=False is the default
        value = value.lower()
        return value.removesuffix("_find_unused_parameters_false") if value in _UNUSED_FALSE else value
    return value


_UNUSED_FALSE = ("ddp_find_unused_parameters_false", "ddp_spawn_find_unused_parameters_false")


def _registered(value: Any) -> Any:
    """A name the Trainer does not know itself but ``StrategyRegistry`` holds becomes the object it registers."""
    if not isinstance(value, str) or value.lower() in STRATEGIES + _UNUSED_FALSE + ("model_parallel",):
        return value
    from gpulayer.trainer.strategies.registry import StrategyRegistry
    return StrategyRegistry.get(value) if value in StrategyRegistry else value


def _plugin_kind(plugin: Any) -> str | None:
    from gpulayer.trainer.plugins import CheckpointIO, Precision
    from gpulayer.trainer.plugins.environments import ClusterEnvironment
    from gpulayer.trainer.plugins.layer_sync import LayerSync
    for kind in (Precision, CheckpointIO, ClusterEnvironment, LayerSync):
        if isinstance(plugin, kind):
            return kind.__name__
    return None


def _plugins(plugins: Any, strategy: Any) -> dict[str, Any]:
    """``Trainer(plugins=...)`` and a strategy object's own plugins, by kind ("Precision", "CheckpointIO",
    "ClusterEnvironment", "LayerSync"): at most one of each."""
    given = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    found: dict[str, Any] = {}
    seen: dict[str, int] = {}
    for plugin in given:
        kind = _plugin_kind(plugin)
        if kind is None:
            raise MisconfigurationException(
                f"Found invalid type for plugin {plugin}. Expected one of: Precision, CheckpointIO, "
                "ClusterEnvironment, or LayerSync.")
        found[kind] = plugin
        seen[kind] = seen.get(kind, 0) + 1
    duplicated = [k for k, n in seen.items() if n > 1]
    if duplicated:
        raise MisconfigurationException(f"Received multiple values for {', '.join(duplicated)} flags in `plugins`. "
                                        "Expected one value for each type at most.")
    own_precision = getattr(strategy, "_precision_plugin", None)
    if own_precision is not None:
        if "Precision" in found:
            raise MisconfigurationException("precision set through both strategy class and plugins, choose one")
        found["Precision"] = own_precision
    own_io = getattr(strategy, "_checkpoint_io", None)
    if own_io is not None:
        if "CheckpointIO" in found:
            raise MisconfigurationException("checkpoint_io set through both strategy class and plugins, choose one")
        found["CheckpointIO"] = own_io
    return found


def _layer_sync(sync_batchnorm: bool, given: Any, strategy: Any) -> Any:
    """``sync_batchnorm=True`` means ``TorchSyncBatchNorm``; a ``LayerSync`` plugin is the other way to ask, not both.
    A strategy object without one gets it, as Lightning's connector sets it."""
    if sync_batchnorm and given is not None:
        raise MisconfigurationException(
            "You set `Trainer(sync_batchnorm=True)` and provided a `LayerSync` plugin, but this is not allowed. "
            f"Choose one or the other (got {given!r}).")
    if sync_batchnorm:
        from gpulayer.trainer.plugins.layer_sync import TorchSyncBatchNorm
        given = TorchSyncBatchNorm()
    if given is not None and hasattr(strategy, "_layer_sync") and strategy._layer_sync is None:
        strategy._layer_sync = given
    return given


def _int_at_least(name: str, value: Any, low: int, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TrainerConfigError(f"Trainer({name}={value!r}) must be an integer >= {low}")
    return value


def _limit(name: str, value: Any) -> int | float:
    """Lightning's batch limits: a float in [0, 1] is a fraction, an int (or a whole float > 1) a count; None: all."""
    if value is None:
        return 1.0
    if value == 1 and not isinstance(value, bool) and isinstance(value, (int, float)):
        _say_what_one_means(name, value)
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        if 0 <= value <= 1:
            return value
        if value > 1 and value % 1.0 == 0:
            return int(value)
    raise TrainerConfigError(
        f"You have passed invalid value {value} for {name}, it has to be in [0.0, 1.0] or an int. "
        f"(Trainer({name}={value!r}): a float is a fraction of the batches, an int a number of batches)")


def _say_what_one_means(name: str, value: int | float) -> None:
    """``1`` and ``1.0`` mean different things (a batch, the whole epoch): an explicit one is explained (INFO)."""
    from gpulayer.trainer.utilities.rank_zero import rank_zero_info
    if name == "val_check_interval":
        what = "validation will run after every batch" if isinstance(value, int) else \
            "validation will run at the end of the training epoch"
    elif name == "limit_train_batches":
        what = "1 batch per epoch will be used" if isinstance(value, int) else "100% of the batches per epoch will be used"
    else:
        what = "1 batch will be used" if isinstance(value, int) else "100% of the batches will be used"
    rank_zero_info(f"`Trainer({name}={value})` was configured so {what}.")


def _add_timer(cfg: TrainerConfig, max_time: Any) -> None:
    """Lightning's ``max_time``: a ``Timer(duration=max_time, interval="step")`` callback, unless one is given.

    A Timer bounds the run, so ``max_epochs`` left unset means no epoch limit (not 1000)."""
    from gpulayer.trainer.callbacks.timer import Timer
    from gpulayer.trainer.utilities.rank_zero import rank_zero_info
    timers = [c for c in cfg.callbacks if isinstance(c, Timer)]
    if max_time is not None and timers:
        rank_zero_info("Ignoring `Trainer(max_time=...)`, callbacks list already contains a Timer.")
    elif max_time is not None:
        timers = [Timer(duration=_dt.timedelta(seconds=cfg.max_time), interval="step")]
        cfg.callbacks.append(timers[0])
    if timers and not cfg.max_epochs_given and cfg.max_steps == -1:
        cfg.max_epochs = -1


def _max_time(value: Any) -> float | None:
    """Lightning accepts "DD:HH:MM:SS", a timedelta or a dict of timedelta fields."""
    if value is None:
        return None
    try:
        if isinstance(value, _dt.timedelta):
            return value.total_seconds()
        if isinstance(value, dict):
            return _dt.timedelta(**value).total_seconds()
        if isinstance(value, str):
            d, h, m, s = (int(x) for x in value.split(":"))
            return _dt.timedelta(days=d, hours=h, minutes=m, seconds=s).total_seconds()
    except (TypeError, ValueError) as err:
        raise TrainerConfigError(
            f"Trainer(max_time={value!r}) must be 'DD:HH:MM:SS', a datetime.timedelta or a dict like {{'hours': 1}}"
        ) from err
    raise TrainerConfigError(f"Trainer(max_time={value!r}) must be 'DD:HH:MM:SS', a datetime.timedelta or a dict")


def _runnable_names() -> list[str]:
    """The ``accelerator=`` strings this Trainer accepts: "auto", "gpu" and the registered kinds it can run
    (MPS and XLA are registered, as in Lightning, but gpulayer's strategies place work on CPU or CUDA only)."""
    from gpulayer.trainer.accelerators import AcceleratorRegistry, MPSAccelerator, XLAAccelerator
    kinds = [name for name, entry in AcceleratorRegistry.items()
             if not issubclass(entry["accelerator"], (MPSAccelerator, XLAAccelerator))]
    return sorted({"auto", "gpu", *kinds})


def _device_kind(accelerator: Any) -> str:
    """The torch device type the strategies place work on: CUDA for a ``CUDAAccelerator``, else the host."""
    from gpulayer.trainer.accelerators import CUDAAccelerator
    return "cuda" if isinstance(accelerator, CUDAAccelerator) else "cpu"


def _accelerator(value: Any, here: bool = True) -> tuple[str, Any]:
    """``accelerator=``: a name in ``AcceleratorRegistry`` ("auto": CUDA where available, else CPU; "gpu": CUDA)
    or an ``Accelerator`` instance, used as given. Returns the device kind and the accelerator object.

    ``here``: the fit runs on this machine, so the accelerator must be available here (not so for a cluster fit)."""
    from gpulayer.trainer.accelerators import Accelerator, AcceleratorRegistry, CUDAAccelerator
    if isinstance(value, Accelerator):
        return _device_kind(value), value
    accepted = _runnable_names()
    if not isinstance(value, str) or value.lower() not in accepted:
        shown = ", ".join(repr(a) for a in accepted)
        err = TrainerConfigError(f"You selected an invalid accelerator name: `accelerator={value!r}`. Available "
                                 f"names are: {shown}. (Trainer(accelerator={value!r}) is not supported)")
        if isinstance(value, str) and value.lower() in AcceleratorRegistry:
            kind = type(AcceleratorRegistry.get(value.lower())).__name__
            err = TrainerConfigError(f"{err} ({kind} is registered, as in Lightning, but gpulayer's Trainer places "
                                     "work on CPU or CUDA only)")
        raise err
    name = value.lower()
    if name == "auto":
        name = "cuda" if CUDAAccelerator.is_available() else "cpu"
    elif name == "gpu":
        name = "cuda"
    accelerator = AcceleratorRegistry.get(name)
    if here and value.lower() == "gpu" and not accelerator.is_available():
        raise TrainerConfigError("No supported gpu backend found! (Trainer(accelerator='gpu') needs a CUDA device "
                                 "that torch sees; use accelerator='cpu' or 'auto')")
    if here and not accelerator.is_available():
        usable = [n for n in accepted if n not in ("auto", "gpu") and AcceleratorRegistry.get(n).is_available()]
        raise TrainerConfigError(
            f"Trainer(accelerator={value!r}): `{name}` can not run on your system since the accelerator is not "
            f"available. The following accelerator(s) is available and can be passed into `accelerator` argument "
            f"of `Trainer`: {usable} (for CUDA, install a CUDA build of torch on a machine with a GPU)")
    return _device_kind(accelerator), accelerator


def _refuse_no_devices(value: Any, accelerator: Any) -> None:
    """``devices=0``, ``"0"`` or ``[]`` asks for no device at all, whatever the accelerator."""
    if (value in (0, "0") and not isinstance(value, bool)) or (isinstance(value, (list, tuple)) and not value):
        name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__
        raise TrainerConfigError(f"`Trainer(devices={value!r})` value is not a valid input using {name} "
                                 "accelerator. (use a positive int, -1 (all), a list of GPU ids or 'auto')")


def _devices(value: Any, accelerator: Any, here: bool = True) -> tuple[int, list[int] | None]:
    """Count and, for CUDA, explicit device ids, as ``accelerator`` reads ``devices=`` (its ``parse_devices``;
    "auto": its ``auto_device_count``). On CPU ``devices=M`` means M processes, -1 one per core."""
    kind = _device_kind(accelerator)
    if not here and value in ("auto", -1, "-1"):
        if "LOCAL_WORLD_SIZE" in os.environ:  # inside a launched rank: its machine's process count
            return int(os.environ["LOCAL_WORLD_SIZE"]), None
        if value == "auto" and kind == "cpu":
            return 1, None
        raise TrainerConfigError(
            f"Trainer(num_nodes>1, devices={value!r}): the workers' devices cannot be counted from here; "
            "pass devices=M, the number of processes (GPUs) per machine"
        )
    if value == "auto":
        return int(accelerator.auto_device_count()), None
    if kind == "cpu" and value in (-1, "-1") and not isinstance(value, bool):
        return os.cpu_count() or 1, None
    if not here and kind == "cuda":  # a cluster fit: the GPUs are the workers', not this machine's
        if isinstance(value, (list, tuple)) and value and all(isinstance(i, int) and i >= 0 for i in value):
            return len(value), list(value)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise TrainerConfigError(f"Trainer(num_nodes>1, devices={value!r}): pass devices=M, the number of "
                                     "processes (GPUs) per machine")
        return value, None
    if value == 0 or value == "0" or isinstance(value, bool):
        raise TrainerConfigError(f"Trainer(devices={value!r}): use a positive int, -1 (all), a list of GPU ids or "
                                 "'auto'")
    try:
        parsed = accelerator.parse_devices(value)
    except (TypeError, ValueError, MisconfigurationException) as err:
        raise TrainerConfigError(f"Trainer(devices={value!r}) with {type(accelerator).__name__}: {err}") from None
    if isinstance(parsed, (list, tuple)):
        ids = [int(i) for i in parsed] if kind == "cuda" else None
        explicit = ids if ids and ids != list(range(len(ids))) else None
        return len(parsed), explicit
    if isinstance(parsed, bool) or not isinstance(parsed, int) or parsed <= 0:
        raise TrainerConfigError(f"Trainer(devices={value!r}): {type(accelerator).__name__} gave no devices")
    return parsed, None


def build_config(**kwargs: Any) -> TrainerConfig:
    """Validate Trainer keyword arguments; unknown names get a did-you-mean error."""
    known = set(TrainerConfig.__dataclass_fields__) - {"device_ids", "max_epochs_given", "loggers", "accelerator_object",
                                                        "precision_plugin", "checkpoint_io", "layer_sync",
                                                        "cluster_environment", "process_group_backend"}  # derived
    known |= {"fast_dev_run", "logger", "plugins"}
    for name in kwargs:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            # a TypeError, as Python's own for a signature (Lightning's Trainer lists its arguments)
            raise TrainerTypeError(f"Trainer.__init__() got an unexpected keyword argument {name!r}{hint} "
                                   f"(accepted: {', '.join(sorted(known))})")
    kwargs = {**env_defaults(known), **kwargs}
    barebones_mode = _bool("barebones", kwargs.pop("barebones", False))
    if barebones_mode:
        from gpulayer.trainer import barebones
        kwargs = barebones.apply(kwargs)
    fast_dev_run = kwargs.pop("fast_dev_run", False)

    cfg = TrainerConfig()
    precision = kwargs.get("precision")
    if precision is not None and precision not in PRECISIONS:
        choices = _choices_error("precision", precision, ["32-true", "16-mixed", "bf16-mixed", "16-true",
                                                          "bf16-true", "64-true", 32, "32", 16, "16", "bf16", 64, "64"])
        raise TrainerConfigError(f"Precision {precision!r} is invalid: {choices}")
    kwargs["strategy"] = _registered(kwargs.get("strategy", "auto"))
    found = _plugins(kwargs.get("plugins"), kwargs.get("strategy", "auto"))
    given_precision, cfg.checkpoint_io = found.get("Precision"), found.get("CheckpointIO")
    cfg.cluster_environment = found.get("ClusterEnvironment")
    cfg.sync_batchnorm = _bool("sync_batchnorm", kwargs.get("sync_batchnorm", False))
    cfg.layer_sync = _layer_sync(cfg.sync_batchnorm, found.get("LayerSync"), kwargs.get("strategy", "auto"))
    if given_precision is not None and precision is not None:
        raise ValueError(f"Received both `precision={PRECISIONS[precision]}` and `plugins={given_precision}`. "
                         "Choose one.")
    cfg.precision = PRECISIONS[precision if precision is not None else "32-true"]
    cfg.num_nodes = _int_at_least("num_nodes", kwargs.get("num_nodes", 1), 1)
    here = cfg.num_nodes == 1  # else the fit runs on the cluster's workers: this machine's GPUs do not matter
    _refuse_no_devices(kwargs.get("devices", "auto"), kwargs.get("accelerator", "auto"))
    cfg.accelerator, cfg.accelerator_object = _accelerator(kwargs.get("accelerator", "auto"), here)
    cfg.devices, cfg.device_ids = _devices(kwargs.get("devices", "auto"), cfg.accelerator_object, here)
    from gpulayer.trainer.strategies.fsdp_plan import plan_for
    cfg.sharding = plan_for(kwargs.get("strategy", "auto"))
    strategy = cfg.sharding.name if cfg.sharding is not None else _strategy_name(kwargs.get("strategy", "auto"))
    if strategy not in STRATEGIES + ("model_parallel",):
        raise _choices_error("strategy", strategy, STRATEGIES)
    cfg.strategy = strategy
    cfg.process_group_backend = getattr(kwargs.get("strategy"), "_process_group_backend", None)
    from gpulayer.trainer.plugins.precision import FSDPPrecision, for_trainer
    if strategy == "fsdp" and given_precision is not None and not isinstance(given_precision, FSDPPrecision):
        raise TypeError(f"The FSDP strategy can only work with the `FSDPPrecision` plugin, found {given_precision}")
    cfg.precision_plugin = given_precision if given_precision is not None else \
        for_trainer(cfg.precision, cfg.accelerator, sharded=strategy == "fsdp")
    cfg.precision = getattr(cfg.precision_plugin, "precision", cfg.precision)

    max_steps = kwargs.get("max_steps", -1)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < -1:
        raise TrainerConfigError(f"`max_steps` must be a non-negative integer or -1 (infinite steps). You passed in "
                                 f"{max_steps}. (Trainer(max_steps={max_steps!r}): -1 means no limit)")
    cfg.max_steps = max_steps
    max_epochs = kwargs.get("max_epochs")
    cfg.max_epochs_given = max_epochs is not None
    if max_epochs is None:  # Lightning: 1000 epochs unless max_steps bounds the run
        max_epochs = -1 if max_steps != -1 else 1000
    if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < -1:
        raise TrainerConfigError(f"`max_epochs` must be a non-negative integer or -1. You passed in {max_epochs}. "
                                 f"(Trainer(max_epochs={max_epochs!r}): -1 means no limit)")
    cfg.max_epochs = max_epochs
    max_time = kwargs.get("max_time")
    cfg.max_time = _max_time(max_time)  # checked here; the Timer callback below enforces it
    cfg.min_epochs = _int_at_least("min_epochs", kwargs.get("min_epochs"), 0, allow_none=True)
    cfg.min_steps = _int_at_least("min_steps", kwargs.get("min_steps"), 0, allow_none=True)
    if cfg.min_epochs is None and cfg.min_steps is not None:
        cfg.min_epochs = 1  # Lightning's rule: a stop requested at fit start still trains one epoch
    cfg.overfit_batches = _limit("overfit_batches", kwargs.get("overfit_batches", 0.0))
    reload_every = kwargs.get("reload_dataloaders_every_n_epochs", 0)
    if isinstance(reload_every, bool) or not isinstance(reload_every, int) or reload_every < 0:
        raise TrainerConfigError(f"`reload_dataloaders_every_n_epochs` should be an int >= 0, got {reload_every}.")
    cfg.reload_dataloaders_every_n_epochs = reload_every
    cfg.limit_train_batches = _limit("limit_train_batches", kwargs.get("limit_train_batches"))
    cfg.limit_val_batches = _limit("limit_val_batches", kwargs.get("limit_val_batches"))
    cfg.limit_test_batches = _limit("limit_test_batches", kwargs.get("limit_test_batches"))
    cfg.limit_predict_batches = _limit("limit_predict_batches", kwargs.get("limit_predict_batches"))
    cfg.inference_mode = _bool("inference_mode", kwargs.get("inference_mode", True))
    cfg.use_distributed_sampler = _bool("use_distributed_sampler", kwargs.get("use_distributed_sampler", True))
    summary = kwargs.get("enable_model_summary")
    cfg.enable_model_summary = True if summary is None else _bool("enable_model_summary", summary)

    cfg.deterministic = kwargs.get("deterministic", False)
    if cfg.deterministic not in (True, False, "warn", None):
        raise _choices_error("deterministic", cfg.deterministic, [True, False, "warn"])
    cfg.deterministic = bool(cfg.deterministic) and cfg.deterministic
    benchmark = kwargs.get("benchmark", None)
    if benchmark not in (True, False, None):
        raise _choices_error("benchmark", benchmark, [True, False, None])
    cfg.benchmark = (not cfg.deterministic) if benchmark is None else benchmark

    clip = kwargs.get("gradient_clip_val")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float))):
        raise TrainerTypeError(f"`gradient_clip_val` should be an int or a float. Got {clip}. "
                               f"(Trainer(gradient_clip_val={clip!r}): pass a number >= 0 or None)")
    if clip is not None and clip < 0:
        raise TrainerConfigError(f"Trainer(gradient_clip_val={clip!r}) must be None or a number >= 0")
    cfg.gradient_clip_val = float(clip) if clip else None
    algo = kwargs.get("gradient_clip_algorithm")
    if algo is not None and (not isinstance(algo, str) or algo.lower() not in CLIP_ALGORITHMS):
        raise TrainerConfigError(f"`gradient_clip_algorithm` {algo} is invalid. Allowed algorithms: "
                                 f"{list(CLIP_ALGORITHMS)}.")
    cfg.gradient_clip_algorithm = None if algo is None else GradClipAlgorithmType(algo.lower())
    cfg.accumulate_grad_batches = _int_at_least("accumulate_grad_batches", kwargs.get("accumulate_grad_batches", 1), 1)
    every_n = kwargs.get("check_val_every_n_epoch", 1)
    if every_n is not None and (isinstance(every_n, bool) or not isinstance(every_n, int)):
        raise TrainerConfigError(f"`check_val_every_n_epoch` should be an integer, found {every_n!r}. "
                                 "(None validates by val_check_interval batches across epochs)")
    cfg.check_val_every_n_epoch = _int_at_least("check_val_every_n_epoch", every_n, 1, allow_none=True)
    # a float in [0, 1]: that fraction of the epoch's batches; an int: every that many batches (Lightning's rule)
    cfg.val_check_interval = _limit("val_check_interval", kwargs.get("val_check_interval"))
    if cfg.check_val_every_n_epoch is None and isinstance(kwargs.get("val_check_interval"), float):
        raise TrainerConfigError(
            "`val_check_interval` should be an integer or a time-based duration (str 'DD:HH:MM:SS', "
            "datetime.timedelta, or dict kwargs for timedelta) when `check_val_every_n_epoch=None`. "
            f"(Trainer(val_check_interval={cfg.val_check_interval}) is a fraction of an epoch, which has no meaning "
            "without epochs; pass a number of batches.)")
    # 0: never at steps (what barebones sets; Lightning accepts it)
    cfg.log_every_n_steps = _int_at_least("log_every_n_steps", kwargs.get("log_every_n_steps", 50), 0)
    cfg.num_sanity_val_steps = _int_at_least("num_sanity_val_steps", kwargs.get("num_sanity_val_steps", 2), -1)

    callbacks = kwargs.get("callbacks") or []
    if not isinstance(callbacks, (list, tuple)):
        callbacks = [callbacks]
    from gpulayer.trainer.callbacks import Callback, ModelCheckpoint
    for cb in callbacks:
        if not isinstance(cb, Callback):
            raise TrainerConfigError(
                f"Trainer(callbacks=...) got {type(cb).__name__}; callbacks must subclass gpulayer.trainer.Callback"
            )
    cfg.callbacks = list(callbacks)
    _add_timer(cfg, max_time)
    cfg.enable_checkpointing = _bool("enable_checkpointing", kwargs.get("enable_checkpointing", True))
    if not cfg.enable_checkpointing and any(isinstance(c, ModelCheckpoint) for c in cfg.callbacks):
        raise TrainerConfigError(
            "Trainer was configured with `enable_checkpointing=False` but found `ModelCheckpoint` in callbacks list; "
            "drop one of them")
    if cfg.enable_checkpointing and not any(isinstance(c, ModelCheckpoint) for c in cfg.callbacks):
        cfg.callbacks.append(ModelCheckpoint())

    cfg.default_root_dir = os.fspath(kwargs.get("default_root_dir") or os.getcwd())
    if cfg.num_nodes > 1:  # the ranks run elsewhere, in another working directory: a relative path means nothing
        cfg.default_root_dir = os.path.abspath(os.path.expanduser(cfg.default_root_dir))
    cfg.loggers = _loggers(kwargs.get("logger", True), cfg.default_root_dir)
    progress = kwargs.get("enable_progress_bar")
    cfg.enable_progress_bar = True if progress is None else _bool("enable_progress_bar", progress)
    from gpulayer.trainer.callbacks import ProgressBar, TQDMProgressBar
    bars = [c for c in cfg.callbacks if isinstance(c, ProgressBar)]
    if len(bars) > 1:
        raise TrainerConfigError("You added multiple progress bar callbacks to the Trainer, but currently only one "
                                 "progress bar is supported.")
    if bars and progress is False:
        raise TrainerConfigError(
            "Trainer was configured with `enable_progress_bar=False` but found `TQDMProgressBar` in callbacks list.")
    if cfg.enable_progress_bar and not bars:  # Lightning's default bar: after the user's callbacks, before checkpoints
        tail = len(cfg.callbacks)
        while tail and isinstance(cfg.callbacks[tail - 1], ModelCheckpoint):
            tail -= 1
        cfg.callbacks.insert(tail, TQDMProgressBar())
    cfg.enable_progress_bar = bool(bars) or cfg.enable_progress_bar
    from gpulayer.trainer.callbacks.defaults import add_default_summary
    add_default_summary(cfg.callbacks, cfg.enable_model_summary)
    cfg.detect_anomaly = _bool("detect_anomaly", kwargs.get("detect_anomaly", False))
    cfg.barebones = barebones_mode
    from gpulayer.trainer.profilers import resolve_profiler
    cfg.profiler = resolve_profiler(kwargs.get("profiler"), cfg.default_root_dir)
    cfg.prefetch = _bool("prefetch", kwargs.get("prefetch", True))
    grad_sync = kwargs.get("grad_sync", "auto")
    if grad_sync not in GRAD_SYNC:
        raise _choices_error("grad_sync", grad_sync, GRAD_SYNC)
    cfg.grad_sync = grad_sync
    cfg.cluster_resources = _cluster_resources(kwargs.get("cluster_resources"), cfg.num_nodes)
    cfg.max_restarts = _max_restarts(kwargs.get("max_restarts", 0), cfg.num_nodes)
    cfg.priority = _priority(kwargs.get("priority", 0), cfg.num_nodes)

    if not isinstance(fast_dev_run, int) or fast_dev_run < 0:  # bool is an int: True means 1 batch
        raise TrainerConfigError(f"fast_dev_run={fast_dev_run!r} is not a valid configuration. It should be >= 0.")
    if fast_dev_run:  # Lightning: n batches of train and val, no logger, no checkpoints saved
        n = int(fast_dev_run)
        cfg.fast_dev_run = n
        cfg.max_epochs, cfg.max_steps, cfg.max_epochs_given = 1, n, True
        cfg.limit_train_batches = cfg.limit_val_batches = cfg.limit_test_batches = cfg.limit_predict_batches = n
        cfg.num_sanity_val_steps = 0
        if cfg.loggers:  # as Lightning: a logger that logs nothing stands in for the ones given
            from gpulayer.trainer.loggers import DummyLogger
            cfg.loggers = [DummyLogger()]
        cfg.val_check_interval, cfg.check_val_every_n_epoch = 1.0, 1
        # a ModelCheckpoint given stays in trainer.callbacks, as Lightning's: it saves nothing under fast_dev_run
    if cfg.overfit_batches > 0:  # the same first batches for training and validation, whatever the limits say
        cfg.limit_train_batches = cfg.limit_val_batches = cfg.overfit_batches
    return cfg


def env_defaults(names: set[str]) -> dict[str, Any]:
    """Lightning's ``PL_TRAINER_<ARGUMENT>`` environment variables: defaults that explicit arguments override.

    Values are read as Python literals (``"7"`` is 7, ``"False"`` is False), else kept as strings.
    """
    found = {}
    for name in names:
        raw = os.environ.get(f"PL_TRAINER_{name.upper()}")
        if raw:
            try:
                found[name] = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                found[name] = raw
    return found


def _cluster_resources(value: Any, num_nodes: int) -> Any:
    """A ``gpulayer.Resources`` or dict for the cluster job; checked against the fleet when the fit is submitted."""
    if value is None:
        return None
    if num_nodes == 1:
        raise TrainerConfigError(
            "Trainer(cluster_resources=...) applies to fits on the cluster; set num_nodes > 1 or drop it"
        )
    if isinstance(value, dict) or type(value).__name__ == "Resources":
        return value
    raise TrainerConfigError(
        f"Trainer(cluster_resources={type(value).__name__}) must be a gpulayer.Resources or a dict of its fields"
    )


def _max_restarts(value: Any, num_nodes: int) -> int:
    """Whole-gang restarts of a cluster fit, each resuming from the fit's newest checkpoint (``cluster.py``)."""
    value = _int_at_least("max_restarts", value, 0)
    if value and num_nodes == 1:
        raise TrainerConfigError(
            f"Trainer(max_restarts={value}) applies to fits on the cluster (num_nodes > 1), which resume from their "
            "last checkpoint on live workers; set num_nodes > 1 or drop it")
    return value


def _priority(value: Any, num_nodes: int) -> int:
    """A cluster fit's priority as a gang's (``distributed(priority=)``): 0 to 9, higher wins, 0 the lowest."""
    value = _int_at_least("priority", value, 0)
    if value > 9:
        raise TrainerConfigError(f"Trainer(priority={value}): priorities go from 0 (the lowest, the default) to 9")
    if value and num_nodes == 1:
        raise TrainerConfigError(
            f"Trainer(priority={value}) applies to fits on the cluster (num_nodes > 1), which wait in its line and "
            "may preempt gangs of lower priority; set num_nodes > 1 or drop it")
    return value


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _choices_error(name, value, [True, False])
    return value


def _loggers(logger: Any, default_root_dir: str) -> list:
    """``Trainer(logger=...)``: True/None (a CSVLogger in ``default_root_dir``), False, one logger or a list of them."""
    from gpulayer.trainer.loggers import CSVLogger, Logger
    if logger is True or logger is None:
        return [CSVLogger(default_root_dir)]
    if logger is False:
        return []
    loggers = list(logger) if isinstance(logger, (list, tuple)) else [logger]
    for lg in loggers:
        # Lightning takes any object with its Logger's methods (it checks nothing); these are the ones the Trainer calls
        missing = [] if isinstance(lg, Logger) else [m for m in LOGGER_METHODS if not callable(getattr(lg, m, None))]
        if missing:
            raise TrainerConfigError(
                f"Trainer(logger={type(lg).__name__}) must be True, False, a gpulayer.trainer logger (CSVLogger, "
                f"TensorBoardLogger), an object with a Logger's methods or a list of them; it lacks {missing}")
    return loggers
