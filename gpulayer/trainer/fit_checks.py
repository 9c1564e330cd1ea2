"""Warnings a fit gives once, at the start of training, about what is likely a user's mistake (Lightning's)."""

from __future__ import annotations

import math
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from gpulayer.trainer import data, loader_state
from gpulayer.trainer.utilities.rank_zero import rank_zero_warn
from gpulayer.trainer.utilities.warnings import PossibleUserWarning


def warn_eval_modules(module: Any) -> None:
    """Some submodule is in eval mode as training starts (``.eval()`` left over, a frozen part): say so."""
    in_eval = [name for name, m in module.named_modules() if not m.training]
    if in_eval:
        rank_zero_warn(f"Found {len(in_eval)} module(s) in eval mode at the start of training. This may lead to "
                       "unexpected behavior during training. If this is intentional, you can ignore this warning.",
                       category=PossibleUserWarning)


def resumable(loader: Any, replayed_exactly: bool) -> bool:
    """The resumed epoch gets the batches it would have had: every loader keeps its position itself
    (``state_dict`` / ``load_state_dict``), or is a DataLoader over a map-style dataset that gpulayer replays
    under the saved random state (``replayed_exactly``: the checkpoint carried it)."""
    loaders = loader.flattened if isinstance(loader, data.CombinedLoader) else [loader]
    stateful = loader_state.all_stateful(loader)
    replayable = replayed_exactly and all(
        isinstance(dl, DataLoader) and not isinstance(dl.dataset, IterableDataset) for dl in loaders)
    return stateful or replayable


def warn_resume_mid_epoch(trainer: Any, loader: Any, num_batches: float, replayed_exactly: bool) -> None:
    """Resuming inside an epoch (Lightning's rule: the optimizer steps done are not a whole number of epochs) with a
    loader whose position cannot be restored: an iterable is read again from its start and skipped forward, which
    gives the same batches only if it yields the same sequence every time."""
    if num_batches == math.inf or num_batches == 0:
        return
    steps_per_epoch = math.ceil(num_batches / trainer.config.accumulate_grad_batches)
    if trainer.global_step % steps_per_epoch != 0 and not resumable(loader, replayed_exactly):
        rank_zero_warn("You're resuming from a checkpoint that ended before the epoch ended and your dataloader is not "
                       "resumable. This can cause unreliable results if further training is done. Consider using an "
                       "end-of-epoch checkpoint or make your dataloader resumable by implementing the `state_dict` / "
                       "`load_state_dict` interface.", category=PossibleUserWarning)
