"""Copy-ahead: while step N runs, batch N+1 is already travelling to the GPU.

The next batch is pinned (unless the loader pinned it) and copied on a side CUDA
stream with ``non_blocking=True``; the compute stream waits for that copy only
when it takes the batch. On CPU there is nothing to overlap: batches are yielded
as they come (``move`` is the identity for CPU tensors).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import torch


def apply_to_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``fn`` on every tensor in a nested batch (tuple, list, dict, namedtuple)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(apply_to_tensors(o, fn) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(apply_to_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        return type(obj)((k, apply_to_tensors(v, fn)) for k, v in obj.items())
    return obj


def move_data_to_device(batch: Any, device: torch.device | str) -> Any:
    """What ``transfer_batch_to_device`` does by default: every tensor, dataclass field and object with a
    ``.to(device)`` method inside ``batch`` moved to ``device`` (Lightning's ``move_data_to_device``)."""
    device = torch.device(device)

    def move(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return obj.to(device, non_blocking=device.type == "cuda")
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return dataclasses.replace(obj, **{f.name: move(getattr(obj, f.name))
                                               for f in dataclasses.fields(obj) if f.init})
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(move(o) for o in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(move(o) for o in obj)
        if isinstance(obj, dict):
            return type(obj)((k, move(v)) for k, v in obj.items())
        to = getattr(obj, "to", None)
        if callable(to):
            moved = to(device)
            return obj if moved is None else moved
        return obj

    return move(batch)


def to_device(batch: Any, device: torch.device) -> Any:
    if device.type == "cpu":
        return batch
    return apply_to_tensors(batch, lambda t: t.to(device, non_blocking=True))


class CudaPrefetcher:
    """Iterate batches already on ``device``, the next one copied ahead on a side stream."""

    def __init__(self, iterator: Iterator, device: torch.device):
        self._it = iterator
        self._device = device
        self._stream = torch.cuda.Stream(device=device)
        self._next: Any = None
        self._done = False
        self._preload()

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cpu" and not t.is_pinned():
            t = t.pin_memory()
        return t.to(self._device, non_blocking=True)

    def _preload(self) -> None:
        try:
            batch = next(self._it)
        except StopIteration:
            self._done = True
            return
        with torch.cuda.stream(self._stream):
            self._next = apply_to_tensors(batch, self._copy)

    def __iter__(self) -> "CudaPrefetcher":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        current = torch.cuda.current_stream(self._device)
        current.wait_stream(self._stream)
        batch = self._next
        # the caching allocator must not reuse these blocks before the compute stream is done with them
        apply_to_tensors(batch, lambda t: t.record_stream(current) if t.is_cuda else None)
        self._preload()
        return batch


def device_batches(iterator: Iterator, device: torch.device, prefetch: bool) -> Iterator:
    """Batches on ``device``: copy-ahead on CUDA when ``prefetch``, plain moves otherwise."""
    if device.type == "cuda" and prefetch:
        return CudaPrefetcher(iterator, device)
    if device.type == "cpu":
        return iterator
    return (to_device(b, device) for b in iterator)
