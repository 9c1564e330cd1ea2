"""Lightning's ``utilities.data`` checks on data loaders: does it have a length, on every rank, and can it be trusted.

``has_len_all_ranks`` is what the Trainer asks of each loader it sets up: a loader without
``__len__`` (an ``IterableDataset`` without one) runs until exhausted (``inf`` batches); one
with a length is checked across ranks (a loader empty everywhere is suspicious, one empty on
a single rank would leave that rank out of the collectives) and, when its dataset is an
``IterableDataset``, the user is warned that the length may not match what worker processes yield.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import IterableDataset

from gpulayer.trainer.utilities.rank_zero import rank_zero_warn

_ITERABLE_LEN_WARNING = (
    "Your `IterableDataset` has `__len__` defined. In combination with multi-process data loading (when "
    "num_workers > 1), `__len__` could be inaccurate if each worker is not configured independently to avoid "
    "having duplicate data.")


def has_iterable_dataset(dataloader: object) -> bool:
    """``dataloader.dataset`` is an ``IterableDataset``."""
    return isinstance(getattr(dataloader, "dataset", None), IterableDataset)


def sized_len(dataloader: object) -> int | None:
    """``len(dataloader)``, or None when it has no length."""
    from gpulayer.trainer.utilities.combined_loader import CombinedLoader
    try:
        if isinstance(dataloader, CombinedLoader):  # counted before it is iterated (its len() wants iter() first)
            return dataloader._total()
        return len(dataloader)  # type: ignore[arg-type]
    except (TypeError, NotImplementedError):
        return None


def has_len(dataloader: object) -> bool:
    """``dataloader`` has a length (in this process); warns when it is 0 or comes from an ``IterableDataset``."""
    length = sized_len(dataloader)
    if length == 0:
        rank_zero_warn(f"`{type(dataloader).__name__}` returned 0 length. Please make sure this was your intention.")
    if length is not None and has_iterable_dataset(dataloader):
        rank_zero_warn(_ITERABLE_LEN_WARNING)
    return length is not None


def has_len_all_ranks(dataloader: object, strategy: Any,
                      allow_zero_length_dataloader_with_multiple_devices: bool = False) -> bool:
    """``dataloader`` has a length; with a length, checked across the ranks of ``strategy``.

    Raises ``RuntimeError`` when this rank's loader is empty while others are not (unless
    ``allow_zero_length_dataloader_with_multiple_devices``); warns when every rank's is empty,
    and when the length comes from an ``IterableDataset``.
    """
    local = sized_len(dataloader)
    if local is None:
        return False
    name = type(dataloader).__name__
    total = local
    launched = torch.distributed.is_available() and torch.distributed.is_initialized()
    if launched and strategy is not None and getattr(strategy, "world_size", 1) > 1:  # else: this rank's alone
        device = getattr(strategy, "root_device", None)
        total = int(strategy.reduce(torch.tensor(local, device=device), op="sum").item())
    if total == 0:
        rank_zero_warn(f"Total length of `{name}` across ranks is zero. Please make sure this was your intention.")
    if total > 0 and local == 0:
        if not allow_zero_length_dataloader_with_multiple_devices:
            raise RuntimeError(f"`{name}` within local rank has zero length. Please make sure that it returns at "
                               "least 1 batch.")
        rank_zero_warn(f"Total length of `{name}` across ranks is zero, but local rank has zero length. Please be "
                       "cautious of uneven batch length.")
    if has_iterable_dataset(dataloader):
        rank_zero_warn(_ITERABLE_LEN_WARNING)
    return True


__all__ = ["has_iterable_dataset", "has_len", "has_len_all_ranks", "sized_len"]
