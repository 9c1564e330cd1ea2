"""``CombinedLoader``: several iterables read together or one after another (Lightning's modes).

``CombinedLoader({"a": loader_a, "b": loader_b}, mode)``; iterating yields ``(batch, batch_idx,
dataloader_idx)``. The batch has the shape of the iterables given (a dict of batches for a
dict, a list for a list), except in ``"sequential"`` mode, which yields one iterable's batch at
a time with that iterable's index. Modes:

- ``"max_size_cycle"`` (the default, and what ``fit`` uses for several train loaders): until the
  longest iterable ends; shorter ones start again from their beginning.
- ``"min_size"``: until the shortest ends.
- ``"max_size"``: until the longest ends; an ended iterable contributes ``None``.
- ``"sequential"``: each iterable to its end, in order.

``limits`` caps each iterable's batches (the Trainer sets it from ``limit_*_batches``).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator

MODES = ("min_size", "max_size_cycle", "max_size", "sequential")


def _flatten(tree: Any) -> tuple[list, Any]:
    """The leaves of nested dicts / lists / tuples (in order) and a spec to rebuild the structure.

    A container of plain values only (``[0, 1]``, ``{"x": 1.0}``) is a leaf, as in Lightning: an iterable of batches.
    """
    if isinstance(tree, (dict, list, tuple)) and all(
            isinstance(v, (int, float, str)) for v in (tree.values() if isinstance(tree, dict) else tree)):
        return [tree], None
    if isinstance(tree, dict):
        leaves: list = []
        specs = {}
        for key, value in tree.items():
            sub, spec = _flatten(value)
            specs[key] = (len(leaves), len(sub), spec)
            leaves.extend(sub)
        return leaves, ("dict", type(tree), specs)
    if isinstance(tree, (list, tuple)):
        leaves, specs = [], []
        for value in tree:
            sub, spec = _flatten(value)
            specs.append((len(leaves), len(sub), spec))
            leaves.extend(sub)
        return leaves, ("seq", type(tree), specs)
    return [tree], None


def _unflatten(leaves: list, spec: Any) -> Any:
    if spec is None:
        return leaves[0]
    kind, cls, specs = spec
    if kind == "dict":
        return cls((k, _unflatten(leaves[s:s + n], sub)) for k, (s, n, sub) in specs.items())
    values = [_unflatten(leaves[s:s + n], sub) for s, n, sub in specs]
    return values if cls is list else cls(values)


def _length(iterable: Any) -> float:
    try:
        return len(iterable)
    except (TypeError, NotImplementedError):
        return math.inf


class CombinedLoader(Iterable):
    """Read a collection of iterables as one; see the module docstring for the modes."""

    def __init__(self, iterables: Any, mode: str = "max_size_cycle") -> None:
        if mode not in MODES:
            raise ValueError(f"Unsupported mode {mode!r}, please select one of: {list(MODES)}.")
        self._iterables = iterables
        self._flattened, self._spec = _flatten(iterables)
        self._mode = mode
        self._limits: list[float] | None = None
        self._iterator: _CombinedIterator | None = None

    @property
    def iterables(self) -> Any:
        """The iterables as given (a dict, a list, or a single one)."""
        return self._iterables

    @property
    def flattened(self) -> list:
        """The iterables as a flat list, in the order their batches are combined."""
        return self._flattened

    @flattened.setter
    def flattened(self, iterables: list) -> None:
        if len(iterables) != len(self._flattened):
            raise ValueError(f"Mismatch in flattened length ({len(iterables)}) and existing length "
                             f"({len(self._flattened)}); set as many iterables as the CombinedLoader holds")
        self._iterables = _unflatten(list(iterables), self._spec)
        self._flattened = list(iterables)

    @property
    def limits(self) -> list[float] | None:
        return self._limits

    @limits.setter
    def limits(self, limits: int | float | list | None) -> None:
        if isinstance(limits, (int, float)):
            limits = [limits] * len(self._flattened)
        elif isinstance(limits, list) and len(limits) != len(self._flattened):
            raise ValueError(f"Mismatch in number of limits ({len(limits)}) and number of iterables "
                             f"({len(self._flattened)})")
        self._limits = limits

    @property
    def sampler(self) -> Any:
        return _unflatten([getattr(dl, "sampler", None) for dl in self._flattened], self._spec)

    @property
    def batch_sampler(self) -> Any:
        return _unflatten([getattr(dl, "batch_sampler", None) for dl in self._flattened], self._spec)

    def _lengths(self) -> list[float]:
        lengths = [_length(dl) for dl in self._flattened]
        if self._limits is not None:
            lengths = [min(n, lim) for n, lim in zip(lengths, self._limits)]
        return lengths

    def __len__(self) -> int:
        """Batches of one pass in this mode: known once ``iter(combined_loader)`` was called (as in Lightning)."""
        if self._iterator is None:
            raise RuntimeError("Please call `iter(combined_loader)` first.")
        return self._total()

    def _total(self) -> int:
        """Batches of one pass in this mode (the Trainer counts before it iterates); TypeError when unsized."""
        lengths = self._lengths()
        if not lengths:
            return 0
        if self._mode == "min_size":
            total = min(lengths)
        elif self._mode == "sequential":
            total = sum(lengths)
        else:
            total = max(lengths)
        if total == math.inf:
            raise TypeError(f"{type(self).__name__} has no len(): an iterable in it is unsized")
        return int(total)

    def _dataset_length(self) -> int:
        """Samples of the datasets behind the iterables, combined as the mode combines batches (min, max or sum);
        datasets without a length are left out."""
        lengths = [n for n in (_len_or_none(getattr(dl, "dataset", None)) for dl in self._flattened)
                   if n is not None]
        if not lengths:
            raise NotImplementedError("All datasets are iterable-style datasets.")
        return min(lengths) if self._mode == "min_size" else sum(lengths) if self._mode == "sequential" \
            else max(lengths)

    def __iter__(self) -> Iterator[tuple[Any, int, int]]:
        self._iterator = _CombinedIterator(self._flattened, self._spec, self._mode, self._lengths())
        return self._iterator

    def _batches(self) -> Iterator[Any]:
        """Only the combined batches (what a ``training_step`` receives), without the indices."""
        for batch, _, _ in iter(self):
            yield batch

    def reset(self) -> None:
        self._iterator = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._iterables!r}, mode={self._mode!r})"


class _CombinedIterator(Iterator):
    def __init__(self, iterables: list, spec: Any, mode: str, lengths: list[float]) -> None:
        self.iterables, self.spec, self.mode, self.lengths = iterables, spec, mode, lengths
        self.idx = 0
        if mode == "sequential":
            self.current = 0
            self.iterator = iter(iterables[0]) if iterables else None
            self.seen = 0
        else:
            self.iterators = [iter(it) for it in iterables]
            self.done = [n == 0 for n in lengths]
            self.counts = [0] * len(iterables)

    @property
    def _consumed(self) -> list[bool]:
        """Per iterable: read to its end at least once (Lightning's name)."""
        return self.done

    def __getstate__(self) -> dict[str, Any]:
        # a DataLoader's iterator holds worker processes and cannot be pickled: a copy starts that one over
        from torch.utils.data.dataloader import _BaseDataLoaderIter
        state = self.__dict__.copy()
        for key in ("iterators", "iterator"):
            if key in state:
                value = state[key]
                state[key] = [None if isinstance(v, _BaseDataLoaderIter) else v for v in value] \
                    if isinstance(value, list) else None if isinstance(value, _BaseDataLoaderIter) else value
        return state

    def __next__(self) -> tuple[Any, int, int]:
        if self.mode == "sequential":
            return self._next_sequential()
        if self.mode == "min_size":
            total = min(self.lengths, default=0)
        else:
            total = max(self.lengths, default=0)
        if self.idx >= total:
            raise StopIteration
        out = []
        for i, it in enumerate(self.iterators):
            out.append(self._next_of(i))
        if all(self.done):  # every iterable ran out (how unsized ones end; in max_size, a batch of Nones)
            raise StopIteration
        idx, self.idx = self.idx, self.idx + 1
        return _unflatten(out, self.spec), idx, 0

    def _next_of(self, i: int) -> Any:
        """The next batch of iterable ``i``: cycled in max_size_cycle, None once done in max_size."""
        if self.counts[i] >= self.lengths[i]:
            self.done[i] = True
            if self.mode == "max_size":
                return None
            if self.mode == "min_size":
                raise StopIteration
            self.iterators[i], self.counts[i] = iter(self.iterables[i]), 0
        try:
            batch = next(self.iterators[i])
        except StopIteration:
            self.done[i] = True
            if self.mode == "max_size":
                return None
            if self.mode == "min_size":
                raise
            self.iterators[i] = iter(self.iterables[i])
            self.counts[i] = 0
            batch = next(self.iterators[i])  # an empty iterable ends the combination here
        self.counts[i] += 1
        return batch

    def _next_sequential(self) -> tuple[Any, int, int]:
        while self.iterator is not None:
            if self.seen < self.lengths[self.current]:
                try:
                    batch = next(self.iterator)
                    idx, self.seen = self.seen, self.seen + 1
                    return batch, idx, self.current
                except StopIteration:
                    pass
            self.current += 1
            self.seen = 0
            self.iterator = iter(self.iterables[self.current]) if self.current < len(self.iterables) else None
        raise StopIteration


def _len_or_none(dataset: object) -> int | None:
    """``len(dataset)``, or None for a dataset without one (an iterable-style dataset, or none at all)."""
    try:
        return len(dataset)  # type: ignore[arg-type]
    except (TypeError, NotImplementedError):
        return None
