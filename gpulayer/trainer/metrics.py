"""What ``self.log`` records, kept on the device until someone needs a number.

``log`` stores the detached tensor (no ``.item()``: no host sync per step).
Values become Python floats only in ``materialize_step`` (every
``log_every_n_steps``) and ``reduce_epoch`` (epoch ends), each with one sync for
all metrics together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from gpulayer.trainer.errors import TrainerConfigError

_REDUCE = {"mean": "mean", "avg": "mean", "sum": "sum", "max": "max", "min": "min"}
_TORCH_REDUCE = {torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min"}


@dataclass
class MetricMeta:
    prog_bar: bool
    logger: bool
    on_step: bool
    on_epoch: bool
    reduce: str
    sync_dist: bool


def batch_size_of(batch: Any) -> int:
    """Lightning's inference: the length of the first tensor found in the batch."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.ndim else 1
    if isinstance(batch, (list, tuple)):
        for b in batch:
            n = batch_size_of(b)
            if n:
                return n
    if isinstance(batch, dict):
        for b in batch.values():
            n = batch_size_of(b)
            if n:
                return n
    return 1


class MetricStore:
    """One fit's logged values: latest step values, epoch accumulators, materialised numbers."""

    # (default on_step, default on_epoch, which accumulator) per hook context
    TRAIN_STEP, TRAIN_EPOCH, VAL = (True, False, "train"), (False, True, "train"), (False, True, "val")
    TEST, PREDICT = (False, True, "test"), (False, True, "predict")

    def __init__(self, reduce_fn: Callable[[torch.Tensor, str], torch.Tensor] | None = None):
        self.meta: dict[str, MetricMeta] = {}
        self.step_values: dict[str, Any] = {}          # name -> detached tensor or float
        self.acc: dict[str, dict[str, tuple[list, list]]] = {"train": {}, "val": {}, "test": {}, "predict": {}}
        self.epoch_values: dict[str, torch.Tensor] = {}  # reduced at epoch ends
        self.logged: dict[str, float] = {}               # what went to the logger last
        self.progress: dict[str, float] = {}             # materialised prog_bar values
        self.batch: Any = None                           # the current batch, for batch-size inference
        self._reduce_fn = reduce_fn                      # cross-rank reduction (None: one process)
        self.context = self.TRAIN_STEP
        self.dl_suffix = ""                              # "/dataloader_idx_N" while several eval loaders run

    def context_for(self, acc_name: str | None) -> tuple:
        return {"val": self.VAL, "test": self.TEST}.get(acc_name, self.PREDICT)

    # -- the hot path ------------------------------------------------------------------
    def log(self, name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, batch_size) -> None:
        default_step, default_epoch, acc_name = self.context
        if on_step is None:
            on_step = default_step
        if on_epoch is None:
            on_epoch = default_epoch
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise TrainerConfigError(f"self.log({name!r}, ...) needs a scalar; got a tensor of shape {tuple(value.shape)}")
            value = value.detach()
        elif not isinstance(value, (int, float)):
            raise TrainerConfigError(f"self.log({name!r}, ...) needs a number or a scalar tensor; got {type(value).__name__}")
        if name not in self.meta:
            self._register(name, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist)
        if on_step:
            self.step_values[name] = value
        if on_epoch:
            acc = self.acc[acc_name].get(name)
            if acc is None:
                acc = self.acc[acc_name][name] = ([], [])
            acc[0].append(value)
            acc[1].append(batch_size if batch_size is not None else batch_size_of(self.batch))

    def _register(self, name, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist) -> None:
        reduce = _REDUCE.get(reduce_fx) if isinstance(reduce_fx, str) else _TORCH_REDUCE.get(reduce_fx)
        if reduce is None:
            raise TrainerConfigError(f"self.log({name!r}, reduce_fx={reduce_fx!r}): accepted 'mean', 'sum', 'max', 'min'")
        self.meta[name] = MetricMeta(bool(prog_bar), True if logger is None else bool(logger), on_step, on_epoch, reduce, sync_dist)

    # -- at log intervals and epoch ends ----------------------------------------------
    def materialize_step(self, sync: bool = True) -> dict[str, float]:
        """The latest step values as floats (one host sync); also refreshes progress values.

        ``sync=False`` skips the cross-rank reduction (for a rank-0-only refresh of the bar).
        """
        names = list(self.step_values)
        if not names:
            return {}
        values = self._to_floats([self.step_values[n] for n in names], [self.meta[n] for n in names], sync)
        out = {}
        for name, v in zip(names, values):
            meta = self.meta[name]
            key = f"{name}_step" if meta.on_epoch else name
            if meta.prog_bar:
                self.progress[key] = v
            if meta.logger:
                out[key] = v
        self.logged.update(out)
        return out

    def reduce_epoch(self, acc_name: str) -> dict[str, float]:
        """Reduce one accumulator (``train`` or ``val``) into epoch values; returns logger floats."""
        acc, self.acc[acc_name] = self.acc[acc_name], {}
        if not acc:
            return {}
        names, tensors = [], []
        for name, (values, sizes) in acc.items():
            meta = self.meta.get(name)
            if meta is None or not values:  # restored from a checkpoint but not logged again
                continue
            device = next((v.device for v in reversed(values) if isinstance(v, torch.Tensor)), torch.device("cpu"))
            vals = torch.stack([(v.float().reshape(()) if isinstance(v, torch.Tensor) else torch.tensor(float(v))).to(device)
                                for v in values])
            if meta.reduce == "mean":
                w = torch.tensor(sizes, dtype=torch.float32, device=device)
                num, den = (vals * w).sum(), w.sum()
                if meta.sync_dist and self._reduce_fn is not None:
                    num, den = self._reduce_fn(num, "sum"), self._reduce_fn(den, "sum")
                value = num / den
            else:
                value = getattr(vals, meta.reduce)()
                if meta.sync_dist and self._reduce_fn is not None:
                    value = self._reduce_fn(value, meta.reduce)
            names.append(name)
            tensors.append(value)
        if not tensors:
            return {}
        floats = torch.stack([t.to(tensors[0].device) for t in tensors]).tolist()
        out = {}
        for name, t, v in zip(names, tensors, floats):
            meta = self.meta[name]
            key = f"{name}_epoch" if meta.on_step else name
            t = torch.tensor(v)
            self.epoch_values[key] = t
            if meta.on_step:
                self.epoch_values[name] = t
            if meta.prog_bar:
                self.progress[key] = v
            if meta.logger:
                out[key] = v
        self.logged.update(out)
        return out

    def callback_metrics(self) -> dict[str, Any]:
        """Lightning's ``trainer.callback_metrics``: step values and epoch values, 0-dim tensors."""
        out: dict[str, Any] = dict(self.epoch_values)
        for name, v in self.step_values.items():
            v = v if isinstance(v, torch.Tensor) else torch.tensor(float(v))
            if self.meta[name].on_epoch:
                out[f"{name}_step"] = v
                out.setdefault(name, v)
            else:
                out[name] = v
        return out

    def _to_floats(self, values: list, metas: list[MetricMeta], sync: bool) -> list[float]:
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        if not tensors:
            return [float(v) for v in values]
        device = tensors[0].device
        stacked = torch.stack([
            (v.float().reshape(()) if isinstance(v, torch.Tensor) else torch.tensor(float(v))).to(device) for v in values
        ])
        if sync and self._reduce_fn is not None and any(m.sync_dist for m in metas):
            synced = self._reduce_fn(stacked.clone(), "mean")
            mask = torch.tensor([m.sync_dist for m in metas], device=device)
            stacked = torch.where(mask, synced, stacked)
        return stacked.tolist()

    # -- checkpoints: the running epoch accumulators, so a mid-epoch resume reports the same epoch means
    def export_acc(self, acc_name: str) -> dict[str, tuple[list[float], list[int]]]:
        return {n: ([float(v) for v in vals], list(sizes)) for n, (vals, sizes) in self.acc[acc_name].items()}

    def import_acc(self, acc_name: str, saved: dict[str, tuple[list[float], list[int]]]) -> None:
        self.acc[acc_name] = {n: ([torch.tensor(v) for v in vals], list(sizes)) for n, (vals, sizes) in saved.items()}

    def load_result(self, callback_metrics: dict[str, Any], logged: dict[str, float]) -> None:
        """Take the metrics a rank-0 process sent back (multi-process fit)."""
        self.step_values = {}
        self.epoch_values = dict(callback_metrics)
        self.logged = dict(logged)
