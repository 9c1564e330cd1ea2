"""Lightning's ``utilities.seed``: ``seed_everything`` and ``isolate_rng``."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from gpulayer.trainer.seed import _np, seed_everything


@contextmanager
def isolate_rng(include_cuda: bool = True) -> Iterator[None]:
    """Run the block with the random states of Python, NumPy and torch (and CUDA's, with ``include_cuda``) put
    back as they were when it ends, so the numbers drawn inside do not change those drawn after.

    >>> torch.manual_seed(1)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> with isolate_rng():
    ...     _ = torch.rand(1)
    >>> torch.rand(1)
    tensor([0.7576])
    """
    python_state = random.getstate()
    numpy_state = _np.random.get_state() if _np is not None else None
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if include_cuda and torch.cuda.is_available() else []
    try:
        yield
    finally:
        random.setstate(python_state)
        if numpy_state is not None:
            _np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if include_cuda:
            torch.cuda.set_rng_state_all(cuda_states)


__all__ = ["isolate_rng", "seed_everything"]
