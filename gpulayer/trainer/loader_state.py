"""Loaders that keep their own position: saved in a checkpoint and restored on resume (Lightning's stateful loaders).

An iterable with ``state_dict()`` and ``load_state_dict(state)`` (torchdata's ``StatefulDataLoader``,
a user's own) is asked for its state when a checkpoint is written; the states of the train
loaders that have one go to Lightning's key ``loops.fit_loop.state_dict.combined_loader``, in
the order of the loaders. A resumed fit gives them back before the epoch's first batch; such
a loader then continues by itself, and gpulayer does not skip batches forward in it. A loader
without state is read again from its start (skipped forward when resuming mid-epoch).
"""

from __future__ import annotations

from typing import Any

from gpulayer.trainer.utilities.combined_loader import CombinedLoader

KEY = "combined_loader"


def _flat(loader: Any) -> list:
    return list(loader.flattened) if isinstance(loader, CombinedLoader) else [loader]


def is_stateful(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def all_stateful(loader: Any) -> bool:
    return all(is_stateful(dl) for dl in _flat(loader))


def state_dicts(loader: Any) -> list[dict[str, Any]]:
    """The states of the loaders that keep one (empty: none does)."""
    return [dl.state_dict() for dl in _flat(loader) if is_stateful(dl)] if loader is not None else []


def load_state_dicts(loader: Any, states: list[dict[str, Any]]) -> bool:
    """Give each stateful loader its saved state; True when some loader was restored."""
    if not states:
        return False
    stateful = [dl for dl in _flat(loader) if is_stateful(dl)]
    if len(stateful) != len(states):
        raise RuntimeError(
            f"The CombinedLoader has {len(stateful)} stateful loaders, but found {len(states)} states in the checkpoint."
            " Please make sure you define the same dataloaders that were used when saving the checkpoint.")
    for dl, state in zip(stateful, states):
        dl.load_state_dict(state)
    return True
