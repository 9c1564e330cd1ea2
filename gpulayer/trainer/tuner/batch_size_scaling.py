"""The batch-size search itself, over a ``trial(size)`` that raises when a size does not fit in memory.

Lightning's rules, step by step (its tests count the messages): the search starts by setting ``init_val``;
``power`` doubles after each success and, after a failure, halves (stopping there once a size has worked);
it runs at most ``max_trials`` trials. ``binsearch`` doubles the same way until a failure, then bisects
between the largest success and the smallest failure; ``max_trials`` counts its successes, and ``margin``
is taken off the result as a safety buffer. A size that reaches the dataset's length (a bigger batch
tests nothing new) or ``max_val`` ends the search. A size that failed always shrinks (Lightning's step keeps a
size at or above the dataset's length even after it failed, and tries it again for ever).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from gpulayer.trainer.utilities.rank_zero import rank_zero_info

_OOM_TEXTS = ("out of memory", "CUDNN_STATUS_NOT_SUPPORTED", "CUDNN_STATUS_EXECUTION_FAILED",
              "can't allocate memory", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED")


def is_oom_error(err: BaseException) -> bool:
    """A failure of memory (CUDA's or the CPU allocator's), which a smaller batch avoids."""
    return isinstance(err, torch.cuda.OutOfMemoryError) or \
        isinstance(err, RuntimeError) and any(text in str(err) for text in _OOM_TEXTS)


@dataclass
class BatchSizeProbe:
    """What the search needs from the model and its data."""

    trial: Callable[[int], None]  # run a few steps at this size (raises on OOM)
    current: Callable[[], int]  # the size the model holds now
    put: Callable[[int], None]  # give the model (and its data) this size
    dataset_length: Callable[[], float | None]  # samples of the searched stage's data (None: unknown)


def _adjust(probe: BatchSizeProbe, factor: float = 1.0, value: int | None = None, desc: str | None = None,
            max_val: int = 8192) -> tuple[int, bool]:
    """The next size to try (and whether it differs from the current one), logged as Lightning logs it."""
    size = probe.current()
    length = probe.dataset_length() if desc != "failed" else None  # a failed size must shrink, whatever the data
    if length is not None and size >= length:
        rank_zero_info(f"The batch size {size} is greater or equal than the length of your dataset: {int(length)}.")
        return size, False
    new = value if value is not None else int(size * factor)
    if new > max_val:
        if desc:
            rank_zero_info(f"Batch size {new} exceeds max_val limit {max_val}, capping at {max_val}")
        new = max_val
    if desc:
        rank_zero_info(f"Batch size {size} {desc}, trying batch size {new}")
    probe.put(new)
    return new, new != size


def search_batch_size(probe: BatchSizeProbe, mode: str, init_val: int, max_trials: int, margin: float,
                      max_val: int) -> int:
    # the oom test is looked up at each failure, so it can be patched in this module (as Lightning's tests do)
    import gpulayer.trainer.tuner.batch_size_scaling as this

    size, _ = _adjust(probe, value=init_val)
    if mode == "power":
        worked = False
        for i in range(max_trials):
            if size >= max_val:
                rank_zero_info(f"Reached the maximum batch size limit of {max_val}. Stopping search.")
                break
            try:
                probe.trial(size)
            except RuntimeError as err:
                if not this.is_oom_error(err):
                    raise
                size, _ = _adjust(probe, factor=0.5, desc="failed")
                if worked:
                    break
                continue
            if i + 1 >= max_trials:
                break
            size, changed = _adjust(probe, factor=2.0, desc="succeeded")
            if not changed:
                break
            worked = True
        return size

    low, high, successes = 1, None, 0
    while True:
        if size >= max_val:
            rank_zero_info(f"Reached the maximum batch size limit of {max_val}. Stopping search.")
            break
        try:
            probe.trial(size)
        except RuntimeError as err:
            if not this.is_oom_error(err):
                raise
            high = size
            size, _ = _adjust(probe, value=(high + low) // 2, desc="failed")
            if high - low <= 1:
                break
            continue
        successes += 1
        if successes >= max_trials:
            break
        low = size
        if high:
            if high - low <= 1:
                break
            size, changed = _adjust(probe, value=(high + low) // 2, desc="succeeded", max_val=max_val)
        else:
            size, changed = _adjust(probe, factor=2.0, desc="succeeded", max_val=max_val)
        if not changed:
            break
    if margin > 0:
        reduced = max(1, int(size * (1 - margin)))
        if reduced != size:
            rank_zero_info(f"Applying margin of {margin:.1%}, reducing batch size from {size} to {reduced}")
            size = reduced
            probe.put(size)
    return size
