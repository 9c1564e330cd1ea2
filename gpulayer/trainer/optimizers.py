"""What ``configure_optimizers`` may return (Lightning's forms), turned into optimizers and scheduler configs.

Accepted: an optimizer; a list of optimizers; ``([optimizers], [schedulers])``;
a dict ``{"optimizer": opt, "lr_scheduler": sched_or_dict, "monitor": name}``;
a list of such dicts. A scheduler dict holds ``scheduler``, ``interval``
(``"step"`` | ``"epoch"``), ``frequency``, ``monitor``, ``name``, ``strict``.
The rules and the messages are Lightning's (``lightning.pytorch.core.optimizer``),
so code and tests written against Lightning see the same outcome; ours add the fix.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from gpulayer.trainer.errors import ManualOptimizationRequired, TrainerConfigError

_FORMS = (
    " * `Optimizer`\n * [`Optimizer`]\n * ([`Optimizer`], [`LRScheduler`])\n"
    ' * {"optimizer": `Optimizer`, (optional) "lr_scheduler": `LRScheduler`}\n'
)


@dataclass
class SchedulerConfig:
    """Lightning's ``LRSchedulerConfig``: the same fields in the same order, plus the optimizer it drives."""

    scheduler: Any
    name: str | None = None
    interval: str = "epoch"
    frequency: int = 1
    reduce_on_plateau: bool = False
    monitor: str | None = None
    strict: bool = True
    optimizer: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.optimizer is None:
            self.optimizer = getattr(self.scheduler, "optimizer", None)


_SCHED_KEYS = {f.name for f in fields(SchedulerConfig)} - {"optimizer"}


def _is_optimizer(obj: Any) -> bool:
    return isinstance(obj, torch.optim.Optimizer) or callable(getattr(obj, "step", None)) and hasattr(obj, "param_groups")


def _split(conf: Any) -> tuple[list, list, str | None]:
    """(optimizers, schedulers as given, monitor) from any of Lightning's forms."""
    if _is_optimizer(conf):
        return [conf], [], None
    if isinstance(conf, (list, tuple)) and len(conf) == 2 and isinstance(conf[0], list) \
            and all(_is_optimizer(o) for o in conf[0]):
        opts, scheds = conf
        return list(opts), list(scheds) if isinstance(scheds, list) else [scheds], None
    if isinstance(conf, dict):
        _check_dict(conf)
        return [conf["optimizer"]], [conf["lr_scheduler"]] if "lr_scheduler" in conf else [], conf.get("monitor")
    if isinstance(conf, (list, tuple)) and conf and all(isinstance(d, dict) for d in conf):
        for d in conf:
            _check_dict(d)
        scheds = [dict(d["lr_scheduler"]) if isinstance(d["lr_scheduler"], dict) else {"scheduler": d["lr_scheduler"]}
                  for d in conf if "lr_scheduler" in d]
        return [d["optimizer"] for d in conf], scheds, None
    if isinstance(conf, (list, tuple)) and all(_is_optimizer(o) for o in conf):
        return list(conf), [], None
    raise TrainerConfigError(
        "Unknown configuration for model optimizers. Output from `model.configure_optimizers()` should be one of:\n"
        + _FORMS + f"(got {type(conf).__name__}, which is not one of Lightning's forms; "
        "e.g. return torch.optim.SGD(self.parameters(), lr=0.1))"
    )


def _check_dict(d: dict) -> None:
    extra = d.keys() - {"optimizer", "lr_scheduler", "monitor"}
    if extra:
        warnings.warn(f"Found unsupported keys in the optimizer configuration: {set(extra)}", RuntimeWarning, stacklevel=4)
    if "optimizer" not in d:
        raise TrainerConfigError(
            f"configure_optimizers returned a dict without 'optimizer' (keys: {sorted(d)}); "
            "return {'optimizer': opt, 'lr_scheduler': sched}"
        )


def _automatic(schedulers: list, monitor: str | None) -> list[SchedulerConfig]:
    configs = []
    for s in schedulers:
        if isinstance(s, dict):
            extra = s.keys() - _SCHED_KEYS
            if extra:
                warnings.warn(f"Found unsupported keys in the lr scheduler dict: {extra}. HINT: remove them from the "
                              "output of `configure_optimizers`.", RuntimeWarning, stacklevel=4)
                s = {k: v for k, v in s.items() if k in _SCHED_KEYS}
            if "scheduler" not in s:
                raise TrainerConfigError(
                    'The lr scheduler dict must have the key "scheduler" with its item being an lr scheduler')
            if "interval" in s and s["interval"] not in ("step", "epoch"):
                raise TrainerConfigError(
                    f'The "interval" key in lr scheduler dict must be "step" or "epoch" but is "{s["interval"]}"')
            s = dict(s)
            s["reduce_on_plateau"] = s.get("reduce_on_plateau",
                                           isinstance(s["scheduler"], torch.optim.lr_scheduler.ReduceLROnPlateau))
            if s["reduce_on_plateau"] and s.get("monitor") is None:
                raise TrainerConfigError(
                    "The lr scheduler dict must include a monitor when a `ReduceLROnPlateau` scheduler is used."
                    ' For example: {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "your_loss"}}')
            if isinstance(s["scheduler"], torch.optim.lr_scheduler.OneCycleLR) and s.get("interval", "epoch") == "epoch":
                warnings.warn("A `OneCycleLR` scheduler is using 'interval': 'epoch'. Are you sure you didn't mean "
                              "'interval': 'step'?", RuntimeWarning, stacklevel=4)
            frequency = s.get("frequency", 1)
            if not isinstance(frequency, int) or frequency < 1:
                raise TrainerConfigError(f"the lr scheduler dict's frequency={frequency!r} must be an int >= 1")
            configs.append(SchedulerConfig(**s))
        elif isinstance(s, torch.optim.lr_scheduler.ReduceLROnPlateau):
            if monitor is None:
                raise TrainerConfigError(
                    "`configure_optimizers` must include a monitor when a `ReduceLROnPlateau` scheduler is used."
                    ' For example: {"optimizer": optimizer, "lr_scheduler": scheduler, "monitor": "metric_to_track"}')
            configs.append(SchedulerConfig(s, reduce_on_plateau=True, monitor=monitor))
        else:
            configs.append(SchedulerConfig(s))
    return configs


def _manual(schedulers: list) -> list[SchedulerConfig]:
    configs = []
    for s in schedulers:
        if isinstance(s, dict):
            ignored = [k for k in s if k in ("reduce_on_plateau", "monitor", "strict")]
            if ignored:
                warnings.warn(f"The lr scheduler dict contains the key(s) {ignored}, but the keys will be ignored. You "
                              "need to call `lr_scheduler.step()` manually in manual optimization.", RuntimeWarning,
                              stacklevel=4)
            configs.append(SchedulerConfig(**{k: v for k, v in s.items() if k not in ignored}))
        else:
            configs.append(SchedulerConfig(s))
    return configs


def parse(result: Any, module: Any = None) -> tuple[list[torch.optim.Optimizer], list[SchedulerConfig]]:
    """(optimizers, scheduler configs) from ``configure_optimizers()``'s return value, validated as Lightning does."""
    automatic = module is None or module.automatic_optimization
    if result is None:  # Lightning runs such a fit with an optimizer that does nothing
        warnings.warn("`LightningModule.configure_optimizers` returned `None`, this fit will run with no optimizer",
                      UserWarning, stacklevel=3)
        result = _MockOptimizer()
    opts, scheds, monitor = _split(result)
    configs = _automatic(scheds, monitor) if automatic else _manual(scheds)
    if module is not None and "optimizer_idx" in inspect.signature(module.training_step).parameters:
        raise ManualOptimizationRequired(
            "Training with multiple optimizers is only supported with manual optimization. Remove the `optimizer_idx`"
            " argument from `training_step`, set `self.automatic_optimization = False` and access your optimizers"
            " in `training_step` with `opt1, opt2, ... = self.optimizers()`.")
    if automatic and len(opts) > 1:
        raise ManualOptimizationRequired(
            "Training with multiple optimizers is only supported with manual optimization. Set"
            " `self.automatic_optimization = False`, then access your optimizers in `training_step` with"
            f" `opt1, opt2, ... = self.optimizers()`. (configure_optimizers returned {len(opts)} optimizers)")
    for c in configs:
        if not (hasattr(c.scheduler, "state_dict") and hasattr(c.scheduler, "load_state_dict")):
            raise TypeError(f"The provided lr scheduler `{type(c.scheduler).__name__}` is invalid."
                            " It should have `state_dict` and `load_state_dict` methods defined.")
        if automatic and not isinstance(c.scheduler, (torch.optim.lr_scheduler.LRScheduler,
                                                      torch.optim.lr_scheduler.ReduceLROnPlateau)) \
                and module is not None and type(module).lr_scheduler_step is _base_lr_scheduler_step() \
                and "lr_scheduler_step" not in vars(module):  # not overridden on the class, nor on the instance
            raise TrainerConfigError(
                f"The provided lr scheduler `{type(c.scheduler).__name__}` doesn't follow PyTorch's LRScheduler API. You "
                "should override the `LightningModule.lr_scheduler_step` hook with your own logic if you are using a "
                "custom LR scheduler.")
        if not any(c.optimizer is o for o in opts):
            raise TrainerConfigError(
                "Some schedulers are attached with an optimizer that wasn't returned from `configure_optimizers`.")
    return opts, configs


def _base_lr_scheduler_step() -> Any:
    from gpulayer.trainer.module import Module
    return Module.lr_scheduler_step


class _MockOptimizer(torch.optim.Optimizer):
    """Stands in when ``configure_optimizers`` returns None: steps and saves nothing (Lightning's)."""

    def __init__(self) -> None:
        super().__init__([torch.zeros(1)], {})

    def add_param_group(self, param_group: dict) -> None:
        pass

    def load_state_dict(self, state_dict: dict) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def step(self, closure: Any = None) -> Any:
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool | None = True) -> None:
        pass

    def __repr__(self) -> str:
        return "No Optimizer"


def step_scheduler(trainer: Any, cfg: SchedulerConfig) -> None:
    """Step one scheduler through the module's ``lr_scheduler_step``; a ReduceLROnPlateau gets its monitored
    value from ``trainer.callback_metrics`` (missing: an error, or a warning and no step with ``strict=False``)."""
    metric = None
    if cfg.reduce_on_plateau:
        metrics = trainer.callback_metrics
        if cfg.monitor not in metrics:
            if not cfg.strict:
                warnings.warn(f"ReduceLROnPlateau conditioned on metric {cfg.monitor} which is not available but "
                              "strict is set to `False`. Skipping learning rate update.", RuntimeWarning, stacklevel=3)
                return
            raise TrainerConfigError(
                f"ReduceLROnPlateau conditioned on metric {cfg.monitor} which is not available. Available metrics "
                f"are: {list(metrics)}. Condition can be set using `monitor` key in lr scheduler dict "
                f"(log it with self.log({cfg.monitor!r}, value))"
            )
        metric = float(metrics[cfg.monitor])
    trainer.lightning_module.lr_scheduler_step(cfg.scheduler, metric)
