"""The logger base class a custom logger subclasses, and the stand-ins other ranks get (Lightning's ``loggers.logger``).

A logger names its run (``name``, ``version``), takes metrics at a step and hyperparameters, and may
hold an ``experiment``: the object of the library behind it (a TensorBoard ``SummaryWriter``, a CSV
writer). Only global rank 0 writes; on the other ranks a property decorated with
``rank_zero_experiment`` gives a ``DummyExperiment``, which accepts any call and does nothing, so
a module's ``self.logger.experiment.add_image(...)`` runs unchanged on every rank.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

from gpulayer.trainer.utilities.rank_zero import _rank, rank_zero_only


def next_version(root: str) -> int:
    """One past the highest ``version_N`` directory under ``root`` (0 when none), local or ``fsspec`` paths."""
    from gpulayer.trainer.loggers.files import filesystem
    fs = filesystem(root)
    try:
        entries = fs.listdir(root, detail=False)
    except (OSError, FileNotFoundError):
        return 0
    taken = []
    for entry in entries:
        base = os.path.basename(str(entry).rstrip("/"))
        number = base[len("version_"):] if base.startswith("version_") else ""
        if number.isdigit() and fs.isdir(entry):
            taken.append(int(number))
    return max(taken) + 1 if taken else 0


class DummyExperiment:
    """What ``experiment`` is on ranks other than 0: any method, any item, any assignment; all do nothing."""

    def nop(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __getattr__(self, _: str) -> Callable:
        return self.nop

    def __getitem__(self, idx: Any) -> DummyExperiment:
        return self  # logger.experiment[0].add_image(...)

    def __setitem__(self, *args: Any, **kwargs: Any) -> None:
        pass


def rank_zero_experiment(fn: Callable) -> Callable:
    """For a logger's ``experiment``: the real one on global rank 0, a ``DummyExperiment`` elsewhere."""

    @functools.wraps(fn)
    def experiment(self: Any) -> Any:
        rank = getattr(rank_zero_only, "rank", None)
        if (_rank() if rank is None else rank) > 0:
            return DummyExperiment()
        return fn(self)

    return experiment


class Logger:
    """What the Trainer needs from a logger (Lightning's names); subclass it for your own.

    A subclass implements ``log_metrics`` and ``log_hyperparams`` and usually ``name`` and ``version``;
    the rest have defaults that do nothing. The base writes nowhere of its own: ``save_dir``, ``root_dir`` and
    ``log_dir`` are None (checkpoints then go under the Trainer's ``default_root_dir``), as in Lightning. A
    logger that writes files under ``save_dir/name/version_N`` subclasses ``FileLogger``.
    """

    LOGGER_JOIN_CHAR = "-"

    @property
    def save_dir(self) -> str | None:
        return None

    @property
    def name(self) -> str | None:
        return None

    @property
    def version(self) -> int | str | None:
        return None

    @property
    def root_dir(self) -> str | None:
        return None

    @property
    def log_dir(self) -> str | None:
        return None

    @property
    def group_separator(self) -> str:
        """What joins a metric's group and name (``"train/loss"``)."""
        return "/"

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement log_metrics(metrics, step)")

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        pass

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Called by ``ModelCheckpoint`` after each checkpoint it saves (loggers that upload them override it)."""

    def save(self) -> None:
        pass

    def finalize(self, status: str) -> None:
        """At the end of a run (``status``: ``"success"``, ``"failed"``): write what is buffered."""
        self.save()


class FileLogger(Logger):
    """A logger writing under ``save_dir/name/version_N`` (the next free N, fixed at first use): the directory
    layout of ``CSVLogger`` and ``TensorBoardLogger``, which ``root_dir`` and ``log_dir`` report."""

    def __init__(self, save_dir: str | os.PathLike | None = None, name: str | None = "lightning_logs",
                 version: int | str | None = None):
        self._save_dir = os.fspath(save_dir) if save_dir is not None else None
        self._name = name or ""
        self._version = version

    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    @property
    def name(self) -> str | None:
        return self._name

    @property
    def root_dir(self) -> str | None:
        return os.path.join(self.save_dir or "", self.name or "")

    @property
    def version(self) -> int | str | None:
        """The next free ``version_N`` under ``root_dir``, fixed at first use."""
        if self._version is None:
            self._version = next_version(self.root_dir)
        return self._version

    @property
    def log_dir(self) -> str | None:
        v = self.version
        return os.path.join(self.root_dir or "", v if isinstance(v, str) else f"version_{v}")


class DummyLogger(Logger):
    """A logger that logs nothing and answers every method (even ones only some loggers have) with a no-op."""

    def __init__(self) -> None:
        self._experiment = DummyExperiment()

    @property
    def experiment(self) -> DummyExperiment:
        return self._experiment

    def log_metrics(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    def __getitem__(self, idx: int) -> DummyLogger:
        return self  # trainer.logger[0] where a list of loggers was expected

    def __getattr__(self, name: str) -> Callable:
        if name.startswith("__"):  # copy/pickle probe dunders: behave as a plain object
            raise AttributeError(name)

        def method(*args: Any, **kwargs: Any) -> None:
            return None

        return method
