"""``Trainer(profiler=...)``: time the hooks, steps and batch fetches of a run (Lightning's ``profilers``).

``profiler="simple"`` records the wall time of every action (``SimpleProfiler``),
``"advanced"`` runs ``cProfile`` per action (``AdvancedProfiler``), ``"pytorch"`` records operators
with ``torch.profiler`` (``PyTorchProfiler``); a ``Profiler``
object works too. Actions have Lightning's names: ``[LightningModule]Net.on_fit_start``,
``[Callback]<state_key>.on_train_batch_end``, ``[LightningDataModule]DM.setup``,
``[Strategy]SingleDeviceStrategy.training_step``, ``[_TrainingEpochLoop].train_dataloader_next``,
``[_EvaluationLoop].val_next``, ``run_training_epoch``... After each stage the summary goes to
``dirpath/filename`` (``<stage>-<filename>.txt``) when a filename is set, else to the log
(rank 0's stdout when logging is not set up).

Profiling is decided once per stage: without a profiler (``PassThroughProfiler``,
the default) no hook, step or iterator is wrapped, so the loop runs as fast as before.

>>> trainer = Trainer(profiler="simple"); trainer.fit(model)            # doctest: +SKIP
>>> trainer.profiler.recorded_durations["[LightningModule]Net.on_fit_start"]  # doctest: +SKIP
[1.2e-06]
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from gpulayer.trainer.errors import TrainerConfigError
from gpulayer.trainer.profilers.advanced import AdvancedProfiler
from gpulayer.trainer.profilers.base import PassThroughProfiler
from gpulayer.trainer.profilers.profiler import Profiler
from gpulayer.trainer.profilers.pytorch import PyTorchProfiler
from gpulayer.trainer.profilers.simple import SimpleProfiler

__all__ = ["AdvancedProfiler", "PassThroughProfiler", "Profiler", "PyTorchProfiler", "SimpleProfiler"]


PROFILERS = {"simple": SimpleProfiler, "advanced": AdvancedProfiler, "pytorch": PyTorchProfiler}
_NOT_HERE = {"xla": "TPU traces"}


def resolve_profiler(value: Any, default_dir: str | None = None) -> Profiler:
    """``Trainer(profiler=...)``: None, ``"simple"``, ``"advanced"``, ``"pytorch"`` or a ``Profiler``."""
    if value is None:
        return PassThroughProfiler()
    if isinstance(value, Profiler):
        return value
    if isinstance(value, str):
        name = value.lower()
        if name in PROFILERS:
            return PROFILERS[name]()
        if name in _NOT_HERE:
            raise TrainerConfigError(
                f"Trainer(profiler={value!r}) ({_NOT_HERE[name]}) is not supported by gpulayer; use 'simple', "
                "'advanced', 'pytorch' or a Profiler object")
        raise TrainerConfigError("When passing string value for the `profiler` parameter of `Trainer`, it can only be "
                                 f"one of {list(PROFILERS)}")
    raise TrainerConfigError("Only None, str and subclasses of `Profiler` are valid values for `Profiler`. Received "
                             f"{value} which is of type {type(value)}.")


def active(profiler: Any) -> bool:
    """Something to record: every wrapping below is skipped otherwise."""
    return profiler is not None and not isinstance(profiler, PassThroughProfiler)


def wrapper(profiler: Any) -> Callable[[Callable, str], Callable]:
    """``wrap(fn, action)``: ``fn`` recorded as ``action`` on each call; ``fn`` itself when not profiling."""
    if not active(profiler):
        return lambda fn, action: fn

    def wrap(fn: Callable, action: str) -> Callable:
        def profiled(*args: Any, **kwargs: Any) -> Any:
            with profiler.profile(action):
                return fn(*args, **kwargs)
        return profiled

    return wrap


class _TimedIterator:
    """Each ``next`` recorded as one call of ``action`` (the time a batch takes to come out of the loader)."""

    def __init__(self, it: Iterator, profiler: Profiler, action: str) -> None:
        self.it, self.profiler, self.action = it, profiler, action

    def __iter__(self) -> "_TimedIterator":
        return self

    def __next__(self) -> Any:
        with self.profiler.profile(self.action):
            return next(self.it)


def timed(it: Iterator, profiler: Any, action: str) -> Iterator:
    """``it`` with its fetches recorded as ``action``; ``it`` itself when not profiling."""
    return _TimedIterator(it, profiler, action) if active(profiler) else it
