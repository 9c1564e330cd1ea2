"""Loggers: a CSV logger built in, TensorBoard when ``tensorboard`` is installed (Lightning's ``loggers``).

Only global rank 0 calls them. What they write is what Lightning's write for the
same run: ``save_dir/name/version_N/`` with ``hparams.yaml`` (the hyperparameters
``save_hyperparameters`` saved, written when they are logged) and, for the CSV
logger, ``metrics.csv``: one row per logging call, columns sorted by name, a
``step`` column, rows buffered and flushed every ``flush_logs_every_n_steps`` steps
and when the run (fit, validate, test) ends.
"""

from __future__ import annotations

import contextlib
import csv
import os
import warnings
from argparse import Namespace
from typing import Any, Mapping

import torch


def _next_version(root: str) -> int:
    """One past the highest ``version_N`` directory under ``root`` (0 when none)."""
    if not os.path.isdir(root):
        return 0
    taken = [int(d.split("_", 1)[1]) for d in os.listdir(root)
             if d.startswith("version_") and d.split("_", 1)[1].isdigit() and os.path.isdir(os.path.join(root, d))]
    return max(taken) + 1 if taken else 0


def _as_dict(params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if isinstance(params, Namespace):
        return vars(params)
    return dict(params) if isinstance(params, Mapping) else params


class Logger:
    """What the Trainer needs from a logger (Lightning's names); subclass it for your own."""

    LOGGER_JOIN_CHAR = "-"

    def __init__(self, save_dir: str | os.PathLike | None = None, name: str | None = "lightning_logs",
                 version: int | str | None = None):
        self._save_dir = os.fspath(save_dir) if save_dir is not None else None
        self._name = name or ""
        self._version = version

    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    @property
    def name(self) -> str:
        return self._name

    @property
    def root_dir(self) -> str:
        return os.path.join(self.save_dir or "", self.name)

    @property
    def version(self) -> int | str:
        """The next free ``version_N`` under ``root_dir``, fixed at first use."""
        if self._version is None:
            self._version = _next_version(self.root_dir)
        return self._version

    @property
    def log_dir(self) -> str:
        v = self.version
        return os.path.join(self.root_dir, v if isinstance(v, str) else f"version_{v}")

    @property
    def group_separator(self) -> str:
        return "/"

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        raise NotImplementedError

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        pass

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        pass

    def save(self) -> None:
        pass

    def finalize(self, status: str) -> None:
        self.save()


class _MetricsWriter:
    """Rows of ``metrics.csv`` in memory until ``save``; a new column rewrites the file under the wider header."""

    NAME_METRICS_FILE = "metrics.csv"

    def __init__(self, log_dir: str, resume: bool = False) -> None:
        self.log_dir = log_dir
        self.metrics: list[dict[str, Any]] = []
        self.metrics_keys: list[str] = []
        self.hparams: dict[str, Any] = {}
        self.metrics_file_path = os.path.join(log_dir, self.NAME_METRICS_FILE)
        if resume:  # the same logger's earlier stage (in another process) wrote here: go on where it stopped
            self._read_back()
        elif os.path.isdir(log_dir) and os.listdir(log_dir):
            warnings.warn(f"Experiment logs directory {log_dir} exists and is not empty. Previous log files in this "
                          "directory will be deleted when the new ones are saved!", stacklevel=3)
            if os.path.isfile(self.metrics_file_path):
                os.remove(self.metrics_file_path)
        os.makedirs(log_dir, exist_ok=True)

    def _read_back(self) -> None:
        """The columns and hyperparameters the files already hold, as the writer that wrote them had them."""
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as f:
                self.metrics_keys = next(csv.reader(f), [])
        hparams_file = os.path.join(self.log_dir, CSVLogger.NAME_HPARAMS_FILE)
        if os.path.isfile(hparams_file):
            from gpulayer.trainer.core.saving import load_hparams_from_yaml
            self.hparams = dict(load_hparams_from_yaml(hparams_file) or {})

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        row = {k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in metrics.items()}
        row["step"] = len(self.metrics) if step is None else step
        self.metrics.append(row)

    def log_hparams(self, params: Mapping[str, Any]) -> None:
        from gpulayer.trainer.core.saving import save_hparams_to_yaml
        self.hparams.update(params)
        save_hparams_to_yaml(os.path.join(self.log_dir, CSVLogger.NAME_HPARAMS_FILE), self.hparams)

    def save(self) -> None:
        if not self.metrics:
            return
        seen = set().union(*self.metrics)
        new = seen - set(self.metrics_keys)
        if new:
            self.metrics_keys = sorted(set(self.metrics_keys) | new)
        exists = os.path.isfile(self.metrics_file_path)
        if new and exists:  # a column the file lacks: rewrite what it holds under the new header
            with open(self.metrics_file_path, newline="") as f:
                old_rows = list(csv.DictReader(f))
            with open(self.metrics_file_path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
                writer.writeheader()
                writer.writerows(old_rows)
        with open(self.metrics_file_path, "a" if exists else "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
            if not exists:
                writer.writeheader()
            writer.writerows(self.metrics)
        self.metrics = []


class CSVLogger(Logger):
    """``metrics.csv`` and ``hparams.yaml`` in ``save_dir/name/version_N`` (Lightning's ``CSVLogger``).

    ``prefix`` is put before every metric name (joined by ``-``); ``experiment`` is the
    writer (created, with ``log_dir``, at first use).
    """

    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, save_dir: str | os.PathLike, name: str | None = "lightning_logs", version: int | str | None = None,
                 prefix: str = "", flush_logs_every_n_steps: int = 100):
        super().__init__(save_dir, name, version)
        self._prefix = prefix
        self._flush_logs_every_n_steps = flush_logs_every_n_steps
        self._experiment: _MetricsWriter | None = None
        # True once this logger opened its directory, in this process or in a rank of a multi-process stage:
        # a later stage's writer appends there instead of clearing it (Lightning's rank 0 keeps one writer)
        self._opened = False

    @property
    def flush_logs_every_n_steps(self) -> int:
        return self._flush_logs_every_n_steps

    @flush_logs_every_n_steps.setter
    def flush_logs_every_n_steps(self, value: int) -> None:
        self._flush_logs_every_n_steps = value

    @property
    def metrics_file_path(self) -> str:
        return os.path.join(self.log_dir, _MetricsWriter.NAME_METRICS_FILE)

    @property
    def experiment(self) -> _MetricsWriter:
        if self._experiment is None:
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _MetricsWriter(self.log_dir, resume=self._opened)
            self._opened = True
        return self._experiment

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if self._prefix:
            metrics = {f"{self._prefix}{self.LOGGER_JOIN_CHAR}{k}": v for k, v in metrics.items()}
        if step is None:
            step = len(self.experiment.metrics)
        self.experiment.log_metrics(metrics, step)
        if (step + 1) % self._flush_logs_every_n_steps == 0:
            self.save()

    def log_hyperparams(self, params: Any = None) -> None:
        self.experiment.log_hparams(_as_dict(params))

    def save(self) -> None:
        self.experiment.save()

    def finalize(self, status: str) -> None:
        if self._experiment is not None:  # nothing was logged: no directory to create
            self.save()

    def __getstate__(self) -> dict[str, Any]:
        # a logger pickled for the ranks of a multi-process stage (or back from rank 0) travels without its
        # writer: rows it buffered are written first, so the other process appends after them
        if self._experiment is not None:
            self._experiment.save()
        state = self.__dict__.copy()
        state["_experiment"] = None
        return state


class TensorBoardLogger(Logger):
    """Event files for TensorBoard and ``hparams.yaml`` in ``save_dir/name/version_N``; needs ``pip install tensorboard``."""

    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, save_dir: str | os.PathLike, name: str | None = "lightning_logs", version: int | str | None = None,
                 log_graph: bool = False, default_hp_metric: bool = True, prefix: str = "", sub_dir: str | None = None,
                 **kwargs: Any):
        super().__init__(save_dir, name, version)
        self._log_graph, self._default_hp_metric, self._prefix = log_graph, default_hp_metric, prefix
        self._sub_dir = None if sub_dir is None else os.fspath(sub_dir)
        self._kwargs = kwargs
        self.hparams: dict[str, Any] = {}
        self._writer = None

    @property
    def log_dir(self) -> str:
        path = super().log_dir
        return os.path.join(path, self._sub_dir) if self._sub_dir else path

    @property
    def experiment(self):
        if self._writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ImportError("TensorBoardLogger needs tensorboard: pip install tensorboard (or use CSVLogger)") from err
            self._writer = SummaryWriter(log_dir=self.log_dir, **self._kwargs)
        return self._writer

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        for k, v in metrics.items():
            name = f"{self._prefix}{self.LOGGER_JOIN_CHAR}{k}" if self._prefix else k
            self.experiment.add_scalar(name, v.item() if isinstance(v, torch.Tensor) else v, step)

    def log_hyperparams(self, params: Any = None, metrics: Mapping[str, Any] | None = None) -> None:
        params = _as_dict(params)
        self.hparams.update(params)
        if metrics is None and self._default_hp_metric:
            metrics = {"hp_metric": -1}
        if metrics:
            from torch.utils.tensorboard.summary import hparams
            flat = {k: v if isinstance(v, (int, float, str, bool, torch.Tensor)) else str(v) for k, v in params.items()}
            for summary in hparams(flat, dict(metrics)):
                self.experiment._get_file_writer().add_summary(summary)
            self.log_metrics(metrics, 0)

    def save(self) -> None:
        if self._writer is not None:
            self._writer.flush()
        hparams_file = os.path.join(self.log_dir, self.NAME_HPARAMS_FILE)
        if os.path.isdir(self.log_dir) and not os.path.isfile(hparams_file):
            from gpulayer.trainer.core.saving import save_hparams_to_yaml
            save_hparams_to_yaml(hparams_file, self.hparams)

    def finalize(self, status: str) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
        self.save()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_writer"] = None
        return state


def log_hyperparams(trainer: Any) -> None:
    """Lightning's rule at the start of a run: the module's and/or datamodule's saved hyperparameters, to every logger.

    Only what ``save_hyperparameters(logger=True)`` saved is logged; keys both define must agree.
    """
    loggers = trainer.loggers
    if not loggers or not trainer.is_global_zero:
        return
    module, dm = trainer.lightning_module, trainer.datamodule
    from_module = getattr(module, "_log_hyperparams", False)
    from_dm = getattr(dm, "_log_hyperparams", False) if dm is not None else False
    params = None
    if from_module and from_dm:
        mod_hp, dm_hp = module.hparams_initial, dm.hparams_initial
        clash = [k for k in mod_hp.keys() & dm_hp.keys() if k != "_class_path" and not _same_value(mod_hp[k], dm_hp[k])]
        if clash:
            raise RuntimeError(f"Error while merging hparams: the keys {clash} are present in both the "
                               "LightningModule's and LightningDataModule's hparams but have different values.")
        params = {**mod_hp, **dm_hp}
    elif from_module:
        params = module.hparams_initial
    elif from_dm:
        params = dm.hparams_initial
    for logger in loggers:
        if params is not None:
            logger.log_hyperparams({k: v for k, v in params.items() if k != "_class_path"})
        logger.log_graph(module)
        logger.save()


def _same_value(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a is b
    try:
        return bool(a == b)
    except Exception:
        return False


def finalize(trainer: Any, status: str = "success") -> None:
    """Every logger's ``finalize`` at the end of a run (fit, validate, test, predict), on global rank 0."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.finalize(status)


# -- loggers across the processes of a multi-process stage ------------------------------------------------
# Lightning's rank 0 is the process that called fit/validate/test/predict, so its loggers' state (the
# version, the CSV writer's columns, what a custom logger kept) is the caller's. Here the ranks are
# other processes: each stage hands them the loggers and takes rank 0's back.

@contextlib.contextmanager
def across_ranks(trainer: Any):
    """Around a stage in other processes, in the calling one: every rank agrees on version_N; when the ranks
    fail (no state comes back), a CSV logger whose directory now exists appends there next time."""
    for logger in trainer.loggers:
        getattr(logger, "version", None)
    try:
        yield
    except BaseException:
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger) and os.path.isdir(logger.log_dir):
                logger._opened = True
        raise


def states_for_caller(trainer: Any) -> list[bytes | None]:
    """In rank 0 after a stage: each logger pickled (None where it no longer pickles) for ``adopt``."""
    import cloudpickle
    states: list[bytes | None] = []
    for logger in trainer.loggers:
        try:
            states.append(cloudpickle.dumps(logger))
        except Exception:  # a custom logger holding something that cannot travel: the caller keeps its copy
            states.append(None)
    return states


def adopt(trainer: Any, states: list[bytes | None] | None) -> None:
    """In the calling process: rank 0's loggers' state into the caller's own logger objects (kept by identity)."""
    import cloudpickle
    for mine, blob in zip(trainer.loggers, states or []):
        if blob is None:
            continue
        theirs = cloudpickle.loads(blob)
        # by position, and by class name: a class pickled by value comes back as a new class object
        if type(theirs).__qualname__ == type(mine).__qualname__ and hasattr(mine, "__dict__"):
            mine.__dict__.update(vars(theirs))
