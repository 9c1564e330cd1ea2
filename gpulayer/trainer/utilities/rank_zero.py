"""``rank_zero_only`` and friends (Lightning's ``utilities.rank_zero``): run or print on global rank 0 only.

The rank comes from the environment a launcher sets (``RANK``, else ``LOCAL_RANK``),
read at each call, so a function decorated at import time in a rank's parent
still knows the rank it runs in.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import Any, Callable, TypeVar

T = TypeVar("T")
log = logging.getLogger("gpulayer.trainer")
if log.level == logging.NOTSET:  # as Lightning's logger: its INFO lines reach whatever handlers the user configured
    log.setLevel(logging.INFO)


def _rank() -> int:
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def rank_zero_only(fn: Callable[..., T], default: T | None = None) -> Callable[..., T | None]:
    """Call ``fn`` on global rank 0; elsewhere return ``default``.

    >>> @rank_zero_only
    ... def report(msg): print(msg)
    """
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> T | None:
        rank = getattr(rank_zero_only, "rank", None)
        if rank is None:
            rank = _rank()
        return fn(*args, **kwargs) if rank == 0 else default

    return wrapped


rank_zero_only.rank = None  # type: ignore[attr-defined]  # Lightning's tests set it by hand; None: read the environment


@rank_zero_only
def rank_zero_info(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    log.info(*args, stacklevel=stacklevel, **kwargs)


@rank_zero_only
def rank_zero_debug(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    log.debug(*args, stacklevel=stacklevel, **kwargs)


@rank_zero_only
def rank_zero_warn(message: str | Warning, stacklevel: int = 4, category: type[Warning] = UserWarning, **kwargs: Any) -> None:
    warnings.warn(message, category=category, stacklevel=stacklevel, **kwargs)


class LightningDeprecationWarning(DeprecationWarning):
    """A name or argument of Lightning's API that a later Lightning removes (users filter on this class)."""


@rank_zero_only
def rank_zero_deprecation(message: str | Warning, stacklevel: int = 5, **kwargs: Any) -> None:
    warnings.warn(message, category=LightningDeprecationWarning, stacklevel=stacklevel, **kwargs)


def rank_prefixed_message(message: str, rank: int | None) -> str:
    return f"[rank: {rank}] {message}" if rank is not None else message


class WarningCache(set):
    """Each message once (per cache) on rank 0: a warning inside a loop does not repeat every batch."""

    def warn(self, message: str, stacklevel: int = 5, **kwargs: Any) -> None:
        if message not in self:
            self.add(message)
            rank_zero_warn(message, stacklevel=stacklevel, **kwargs)

    def info(self, message: str, stacklevel: int = 5, **kwargs: Any) -> None:
        if message not in self:
            self.add(message)
            rank_zero_info(message, stacklevel=stacklevel, **kwargs)
