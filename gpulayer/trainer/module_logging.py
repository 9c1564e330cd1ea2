"""``self.log`` and ``self.log_dict`` of a ``Module``: Lightning's checks and defaults, then the Trainer's metric
store (``metrics.py``); a module set up with ``Fabric`` logs straight to the Fabric's loggers."""

from __future__ import annotations

import numbers
import sys
import warnings
from typing import Any, Mapping

import torch

from gpulayer.trainer import metrics
from gpulayer.trainer.errors import MisconfigurationException


class ModuleLogging:
    """Mixed into ``Module``: reads its ``_trainer``, ``_fabric``, ``_metric_store``, ``_current_fx_name`` and ``device``."""

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
