"""``ObjectRef``: what travels through Redis in place of a large value (a few dozen bytes, signed with the
message that carries it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .format import human

# How a ref reads its value: api.read, set when the package loads (a ref is unpickled through the package,
# gpulayer/objects/__init__.py, so it is always set before a ref exists). Handed in: api.py imports this module.
reader: Callable[["ObjectRef"], Any] | None = None


@dataclass(frozen=True, eq=True)
class ObjectRef:
    """A value in the cluster's object store.

    ``gpulayer.put(x)`` makes one (``auto=False``: a job returning it gives the caller the ref itself); the job
    path makes one for an argument or result over ``inline_limit_bytes`` (``auto=True``: resolved to the value
    wherever it arrives). ``ref.get()`` is the value, read from the store (memory-mapped: tensors and arrays
    come back without a copy). Pass a ref to any number of jobs: each host reads it once.

    >>> ref = gpulayer.put(torch.randn(50_000, 1_000))
    >>> hs = [submit.delay(train_shard, ref, i) for i in range(8)]
    >>> gpulayer.free(ref)   # the jobs still hold it until they end
    """

    oid: str
    size: int
    store: str
    auto: bool = False
    summary: str = field(default="", compare=False)

    def get(self) -> Any:
        """The value (``gpulayer.get(ref)``)."""
        return reader(self)

    def __repr__(self) -> str:
        return f"ObjectRef({self.oid[:8]}..., {human(self.size)})"


def refs_in(value: Any, depth: int = 4) -> list[ObjectRef]:
    """The refs in ``value``: itself, or inside its lists, tuples, sets and dicts (keys and values), to ``depth``."""
    found: list[ObjectRef] = []
    _collect(value, depth, found)
    return found


def _collect(value: Any, depth: int, found: list) -> None:
    kind = type(value)
    if kind is ObjectRef:
        found.append(value)
    elif depth > 0 and kind in (list, tuple, set, frozenset):
        for item in value:
            _collect(item, depth - 1, found)
    elif depth > 0 and kind is dict:
        for k, v in value.items():
            _collect(k, depth - 1, found)
            _collect(v, depth - 1, found)
