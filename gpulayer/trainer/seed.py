"""Seeds and random-number-generator states (for exact resume)."""

from __future__ import annotations

import os
import random
from typing import Any

import torch

try:
    import numpy as _np
except ImportError:  # numpy is optional
    _np = None

SEED_ENV = "GPULAYER_GLOBAL_SEED"
SEED_WORKERS_ENV = "GPULAYER_SEED_WORKERS"


def seed_everything(seed: int | None = None, workers: bool = False) -> int:
    """Seed python, numpy (if installed) and torch (CPU and CUDA); returns the seed.

    The seed is also put in the environment so the ranks of a multi-process fit
    seed themselves the same way, and ``workers=True`` gives each DataLoader
    worker its own derived seed, as in Lightning.
    """
    if seed is None:
        seed = int(os.environ.get(SEED_ENV, random.randint(0, 2**32 - 1)))
    if not isinstance(seed, int) or not 0 <= seed < 2**32:
        from gpulayer.trainer.errors import TrainerConfigError
        raise TrainerConfigError(f"seed_everything({seed!r}): the seed must be an int in [0, 2**32)")
    os.environ[SEED_ENV] = str(seed)
    os.environ[SEED_WORKERS_ENV] = "1" if workers else "0"
    random.seed(seed)
    if _np is not None:
        _np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    return seed


def worker_init_fn(worker_id: int) -> None:
    """Distinct, reproducible seeds per DataLoader worker (used when ``workers=True``)."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    if _np is not None:
        _np.random.seed(seed)


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if _np is not None:
        kind, keys, pos, has_gauss, gauss = _np.random.get_state()
        # plain values, so the checkpoint also loads with torch.load(weights_only=True)
        state["numpy"] = (kind, keys.tolist(), int(pos), int(has_gauss), float(gauss))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if _np is not None and "numpy" in state:
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        _np.random.set_state((kind, _np.asarray(keys, dtype=_np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
