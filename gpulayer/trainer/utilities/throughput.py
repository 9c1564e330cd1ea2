"""Throughput arithmetic (Lightning Fabric's ``utilities.throughput``): ``Throughput``, ``measure_flops``,
``get_available_flops``.

``Throughput`` keeps the last ``window_size`` cumulative readings (time, batches, samples, lengths, FLOPs) and turns
them into rates over that window; no tensors, no syncs. ``ThroughputMonitor`` (the callback) feeds it.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import torch

from gpulayer.trainer.utilities.rank_zero import rank_zero_warn

# Peak dense throughput per device, from the vendors' data sheets (FLOP/s, without sparsity): an optimistic
# ceiling for MFU. Chips are matched by a lowercase substring of torch.cuda.get_device_name().
_CUDA_PEAK_FLOPS: list[tuple[str, dict[Any, float]]] = [
    ("h200", {torch.float64: 67e12, torch.float32: 67e12, "tfloat32": 494.7e12,
              torch.bfloat16: 989.4e12, torch.float16: 989.4e12}),
    ("h100 pcie", {torch.float64: 51.2e12, torch.float32: 51.2e12, "tfloat32": 378e12,
                   torch.bfloat16: 756e12, torch.float16: 756e12}),
    ("h100", {torch.float64: 67e12, torch.float32: 67e12, "tfloat32": 494.7e12,
              torch.bfloat16: 989.4e12, torch.float16: 989.4e12}),
    ("a100", {torch.float64: 19.5e12, torch.float32: 19.5e12, "tfloat32": 156e12,
              torch.bfloat16: 312e12, torch.float16: 312e12}),
    ("l4", {torch.float32: 30.3e12, "tfloat32": 60e12, torch.bfloat16: 121e12, torch.float16: 121e12}),
    ("v100", {torch.float64: 7.8e12, torch.float32: 15.7e12, torch.float16: 125e12}),
    ("t4", {torch.float32: 8.1e12, torch.float16: 65e12}),
]


class Throughput:
    """Rates over the last ``window_size`` updates.

    >>> tp = Throughput(window_size=2)
    >>> tp.update(time=1.0, batches=1, samples=4)
    >>> tp.update(time=2.0, batches=2, samples=8)
    >>> tp.compute()["device/samples_per_sec"]
    4.0

    ``update`` takes running totals (seconds since the start, batches, samples, optionally the samples' lengths)
    and this batch's FLOPs per device. ``compute`` gives the latest totals and, once the window is full,
    ``device{sep}batches_per_sec``, ``device{sep}samples_per_sec``, ``device{sep}items_per_sec`` (with lengths),
    ``device{sep}flops_per_sec`` and ``device{sep}mfu`` (with FLOPs and ``available_flops``); with
    ``world_size > 1`` also the global ``batches_per_sec``, ``samples_per_sec``, ``items_per_sec``,
    ``flops_per_sec``.
    """

    def __init__(self, available_flops: float | None = None, world_size: int = 1, window_size: int = 100,
                 separator: str = "/") -> None:
        if world_size < 1:
            raise ValueError(f"Throughput(world_size={world_size}) must be >= 1")
        if window_size < 2:
            raise ValueError(f"Throughput(window_size={window_size}) must be >= 2: a rate needs two readings")
        self.available_flops = available_flops
        self.world_size = world_size
        self.separator = separator
        self.window_size = window_size
        self._time: deque[float] = deque(maxlen=window_size)
        self._batches: deque[int] = deque(maxlen=window_size)
        self._samples: deque[int] = deque(maxlen=window_size)
        self._lengths: deque[int] = deque(maxlen=window_size)
        self._flops: deque[float] = deque(maxlen=window_size)

    def update(self, *, time: float, batches: int, samples: int, lengths: int | None = None,
               flops: float | None = None) -> None:
        if samples < batches:
            raise ValueError(f"Expected samples ({samples}) to be greater or equal than batches ({batches})")
        if lengths is not None and lengths < samples:
            raise ValueError(f"Expected lengths ({lengths}) to be greater or equal than samples ({samples})")
        for window, value, name in ((self._time, time, "time"), (self._batches, batches, "batches"),
                                    (self._samples, samples, "samples")):
            _append_increasing(window, value, name)
        if lengths is not None:
            _append_increasing(self._lengths, lengths, "lengths")
            if len(self._lengths) != len(self._samples):
                raise RuntimeError(f"If lengths are passed ({len(self._lengths)}), there needs to be the same number "
                                   f"of samples ({len(self._samples)})")
        if flops is not None:
            self._flops.append(flops * self.world_size)

    def compute(self) -> dict[str, int | float]:
        sep, world = self.separator, self.world_size
        out: dict[str, int | float] = {"time": self._time[-1], "batches": self._batches[-1],
                                       "samples": self._samples[-1]}
        if self._lengths:
            out["lengths"] = self._lengths[-1]
        if len(self._time) == self.window_size:
            span = self._time[-1] - self._time[0]
            batches_rate = (self._batches[-1] - self._batches[0]) / span
            samples_rate = (self._samples[-1] - self._samples[0]) / span
            out[f"device{sep}batches_per_sec"] = batches_rate
            out[f"device{sep}samples_per_sec"] = samples_rate
            if world > 1:
                out["batches_per_sec"] = batches_rate * world
                out["samples_per_sec"] = samples_rate * world
            if len(self._lengths) == self.window_size:
                items_rate = (self._lengths[-1] - self._lengths[0]) / span
                out[f"device{sep}items_per_sec"] = items_rate
                if world > 1:
                    out["items_per_sec"] = items_rate * world
        if len(self._flops) == self.window_size:
            # the FLOPs of the first reading were spent before the window's first time stamp
            flops_rate = (sum(self._flops) - self._flops[0]) / (self._time[-1] - self._time[0])
            if world > 1:
                out["flops_per_sec"] = flops_rate
            out[f"device{sep}flops_per_sec"] = flops_rate / world
            if self.available_flops:
                out[f"device{sep}mfu"] = flops_rate / world / self.available_flops
        return out

    def reset(self) -> None:
        for window in (self._time, self._batches, self._samples, self._lengths, self._flops):
            window.clear()


def _append_increasing(window: deque, value: float, name: str) -> None:
    if window and value < window[-1]:
        raise ValueError(f"Expected the value to increase, last: {window[-1]}, current: {value} ({name})")
    window.append(value)


def measure_flops(model: torch.nn.Module, forward_fn: Callable[[], torch.Tensor],
                  loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> int:
    """FLOPs of one ``forward_fn()`` (and, with ``loss_fn``, of the loss and its backward), counted by torch's
    ``FlopCounterMode``. A model built under ``torch.device("meta")`` costs no memory or time::

        with torch.device("meta"):
            model, x = MyModel(), torch.randn(2, 32)
        flops = measure_flops(model, lambda: model(x), lambda y: y.sum())
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        out = forward_fn()
        if loss_fn is not None:
            loss_fn(out).backward()
    return counter.get_total_flops()


def get_available_flops(device: torch.device, dtype: torch.dtype | str) -> int | None:
    """The device's peak FLOP/s for ``dtype`` (CUDA chips of the table above); ``None`` elsewhere (CPU) or
    for a chip or dtype the table lacks (with a warning)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    chip = name.lower().replace("-", " ")
    table = next((peaks for key, peaks in _CUDA_PEAK_FLOPS if key in chip), None)
    if table is None:
        rank_zero_warn(f"FLOPs not found for {name!r}")
        return None
    if dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest" and "tfloat32" in table:
        dtype = "tfloat32"  # matmuls run on TF32 tensor cores
    if dtype not in table:
        rank_zero_warn(f"{name!r} does not support {dtype}")
        return None
    return int(table[dtype])


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype the math runs in under a Trainer ``precision`` setting (what the peak FLOPs depend on)."""
    precision = str(precision)
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    if precision.startswith("64"):
        return torch.float64
    return torch.float32


__all__ = ["Throughput", "get_available_flops", "measure_flops"]
