"""Steps that pull their own batches: ``training_step(self, dataloader_iter)`` and its eval/predict kin.

Lightning's (experimental) flavour: a step whose signature names ``dataloader_iter`` gets an
iterator instead of a batch, and ``next(dataloader_iter)`` gives ``(batch, batch_idx,
dataloader_idx)``. The step takes as many batches as it likes (prefetching, micro-batches);
the loop calls it again until the stage's batches (after ``limit_*_batches``) are used up.
The batches are not moved to the device (the step does it), and the batch hooks see the
last batch the step took: ``on_*_batch_start`` the one of the previous step (``None`` at
first), ``on_*_batch_end`` the step's own last one.

The flavour is decided once per stage from the step's signature (``takes_iterator``); a
module without it runs the usual per-batch loops.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Iterator

from gpulayer.trainer import data, trainer_logging


def takes_iterator(fn: Any, name: str) -> bool:
    """The step names a ``dataloader_iter`` parameter (Lightning looks for exactly that name)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    if "dataloader_iter" not in params:
        return False
    warnings.warn(f"Found `dataloader_iter` argument in the `{name}`. Note that the support for this signature is "
                  "experimental and the behavior is subject to change.", UserWarning, stacklevel=3)
    return True


class DataLoaderIter(Iterator):
    """What the step receives. ``done`` once ``length`` batches were taken or the data ran out.

    ``batch``, ``batch_idx``, ``dataloader_idx``: the last triple handed out (what the hooks see).
    """

    def __init__(self, source: Iterator[tuple[Any, int, int]], length: float):
        self._source, self.length = source, length
        self.fetched = 0
        self.done = length == 0
        self.batch: Any = None
        self.batch_idx, self.dataloader_idx = 0, 0

    def __iter__(self) -> DataLoaderIter:
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self.done:
            raise StopIteration
        try:
            item = next(self._source)
        except StopIteration:
            self.done = True
            raise
        self.fetched += 1
        self.done = self.fetched >= self.length
        self.batch, self.batch_idx, self.dataloader_idx = item
        return item


def train_iterator(batches: Iterator, length: float, start: int = 0) -> DataLoaderIter:
    """The fit's iterator over the epoch's (combined) batches; ``start``: batches already done (a resume)."""
    return DataLoaderIter(((b, i, 0) for i, b in enumerate(batches, start)), length - start)


def steps(it: DataLoaderIter) -> Iterator[DataLoaderIter]:
    """The fit loop's "batches" in this flavour: the iterator itself, once per step, until it is done."""
    while not it.done:
        yield it


def training_step_fn(step_fn: Callable, flavour: str) -> Callable:
    """``step_fn`` (the module's ``training_step``, or DDP around it) as the loop calls it: ``fn(batch, batch_idx)``.

    ``flavour``: ``"batch_idx"`` (Lightning's usual call), ``"batch"`` (the step has no ``batch_idx``) or
    ``"iterator"`` (the "batch" is a ``DataLoaderIter``). A step that lets the iterator's ``StopIteration``
    escape counts as one that returned ``None``; the epoch ends after it.
    """
    if flavour == "batch_idx":
        return step_fn
    if flavour == "batch":
        return lambda batch, batch_idx: step_fn(batch)

    def call(it: DataLoaderIter, batch_idx: int) -> Any:
        try:
            return step_fn(it)
        except StopIteration:
            return None

    return call


def takes_batch_idx(fn: Any) -> bool:
    """Lightning calls ``step(batch)`` when the step has no ``batch_idx`` parameter (nor room for a second one)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    if "batch_idx" in params or any(p.kind == p.VAR_POSITIONAL for p in params.values()):
        return True
    return len(params) >= 2


def training_flavour(module: Any) -> str:
    """How the fit loop calls ``module.training_step`` (decided once per fit), see ``training_step_fn``."""
    step = module.training_step
    if takes_iterator(step, "training_step"):
        return "iterator"
    return "batch_idx" if takes_batch_idx(step) else "batch"


def eval_iterator(loop: Any) -> DataLoaderIter:
    """An eval/predict stage's loaders one after another (each to its limit), as one iterator of triples."""
    counts = [loop._num_batches(dl) for dl in loop.loaders]

    def source() -> Iterator[tuple[Any, int, int]]:
        for dl_idx, (loader, n) in enumerate(zip(loop.loaders, counts)):
            if n == 0:
                continue
            data.set_epoch(loader, loop.trainer.current_epoch)
            for i, batch in enumerate(data.batches_of(loader)):
                if i >= n:
                    break
                yield batch, i, dl_idx

    return DataLoaderIter(source(), sum(counts))


def run_eval(loop: Any, step: Callable) -> None:
    """The eval/predict loop of this flavour (``EvalLoop.run`` calls it inside its grad-off context)."""
    t, p = loop.trainer, loop.prefix
    hooks, store = t.hooks, t.metric_store
    multi = len(loop.loaders) > 1
    it = eval_iterator(loop)
    while not it.done:
        extra = (it.dataloader_idx,) if multi else ()
        store.dl_idx = it.dataloader_idx if multi else None
        store.batch = it.batch
        hooks.call(f"on_{p}_batch_start", it.batch, it.batch_idx, *extra)
        try:
            with t.precision_plugin.forward_context():
                out = step(it)
        except StopIteration:  # the step ran out of batches: the stage ends here, as in Lightning
            break
        extra = (it.dataloader_idx,) if multi else ()
        if loop.stage == "predict":
            t.predict_loop.batch_done(it.dataloader_idx, it.batch_idx)
        hooks.call(f"on_{p}_batch_end", out, it.batch, it.batch_idx, *extra)
        if loop.stage == "predict":
            t.predict_loop.keep_output(it.dataloader_idx, out)
        if not loop.sanity and loop.acc_name is not None:
            trainer_logging.log_eval_step_metrics(t, loop.acc_name)
    store.dl_idx = None
