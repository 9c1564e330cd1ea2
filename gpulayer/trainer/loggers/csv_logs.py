"""``CSVLogger``: ``metrics.csv`` and ``hparams.yaml`` in ``save_dir/name/version_N`` (Lightning's ``loggers.csv_logs``).

``metrics.csv`` has one row per logging call, a ``step`` column and the metrics' names as columns
(sorted); rows are buffered and written every ``flush_logs_every_n_steps`` steps and when the run
ends. A name the file has no column for yet rewrites it under the wider header. ``save_dir`` may be
any ``fsspec`` URL (``memory://``, ``s3://``).
"""

from __future__ import annotations

import csv
import io
import os
import warnings
from typing import Any, Mapping

import torch

from gpulayer.trainer.loggers.files import filesystem
from gpulayer.trainer.loggers.logger import FileLogger, rank_zero_experiment
from gpulayer.trainer.loggers.params import add_prefix, convert_params


class ExperimentWriter:
    """The CSV logger's ``experiment``: rows of ``metrics.csv`` in memory until ``save``, and ``hparams.yaml``.

    ``resume=True`` goes on with what an earlier writer of the same logger wrote there (another stage,
    in another process) instead of clearing it.
    """

    NAME_METRICS_FILE = "metrics.csv"
    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, log_dir: str, resume: bool = False) -> None:
        self.log_dir = log_dir
        self._fs = filesystem(log_dir)
        self.metrics: list[dict[str, Any]] = []
        self.metrics_keys: list[str] = []
        self.hparams: dict[str, Any] = {}
        self.metrics_file_path = os.path.join(log_dir, self.NAME_METRICS_FILE)
        if resume:
            self._read_back()
        else:
            self._check_log_dir_exists()
        self._fs.makedirs(log_dir, exist_ok=True)

    def _check_log_dir_exists(self) -> None:
        if self._fs.isdir(self.log_dir) and self._fs.listdir(self.log_dir):
            warnings.warn(f"Experiment logs directory {self.log_dir} exists and is not empty. Previous log files in "
                          "this directory will be deleted when the new ones are saved!", stacklevel=4)
            if self._fs.isfile(self.metrics_file_path):
                self._fs.rm_file(self.metrics_file_path)

    def _read_back(self) -> None:
        """The columns and hyperparameters the files already hold, as the writer that wrote them had them."""
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                self.metrics_keys = next(csv.reader(f), [])
        hparams_file = os.path.join(self.log_dir, self.NAME_HPARAMS_FILE)
        if self._fs.isfile(hparams_file):
            from gpulayer.trainer.core.saving import load_hparams_from_yaml
            self.hparams = dict(load_hparams_from_yaml(hparams_file) or {})

    def log_metrics(self, metrics_dict: Mapping[str, Any], step: int | None = None) -> None:
        row = {k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in metrics_dict.items()}
        row["step"] = len(self.metrics) if step is None else step
        self.metrics.append(row)

    def log_hparams(self, params: Mapping[str, Any]) -> None:
        from gpulayer.trainer.core.saving import save_hparams_to_yaml
        self.hparams.update(params)
        save_hparams_to_yaml(os.path.join(self.log_dir, self.NAME_HPARAMS_FILE), self.hparams)

    def save(self) -> None:
        """Append the buffered rows (rewriting the file first when a row brings a new column)."""
        if not self.metrics:
            return
        new = set().union(*self.metrics) - set(self.metrics_keys)
        if new:
            self.metrics_keys = sorted(set(self.metrics_keys) | new)
        exists = self._fs.isfile(self.metrics_file_path)
        if new and exists:
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                old_rows = list(csv.DictReader(f))
            self._write("w", old_rows, header=True)
        self._write("a" if exists else "w", self.metrics, header=not exists)
        self.metrics = []

    def _write(self, mode: str, rows: list[dict[str, Any]], header: bool) -> None:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=self.metrics_keys)
        if header:
            writer.writeheader()
        writer.writerows(rows)
        with self._fs.open(self.metrics_file_path, mode, newline="") as f:
            f.write(text.getvalue())


class CSVLogger(FileLogger):
    """``metrics.csv`` and ``hparams.yaml`` in ``save_dir/name/version_N`` (Lightning's ``CSVLogger``).

    ``prefix`` is put before every metric name (joined by ``-``); ``experiment`` is the
    ``ExperimentWriter`` (created, with ``log_dir``, at first use, on global rank 0).
    """

    NAME_HPARAMS_FILE = ExperimentWriter.NAME_HPARAMS_FILE

    def __init__(self, save_dir: str | os.PathLike, name: str | None = "lightning_logs", version: int | str | None = None,
                 prefix: str = "", flush_logs_every_n_steps: int = 100):
        super().__init__(save_dir, name, version)
        self._prefix = prefix
        self._flush_logs_every_n_steps = flush_logs_every_n_steps
        self._experiment: ExperimentWriter | None = None
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
        return os.path.join(self.log_dir, ExperimentWriter.NAME_METRICS_FILE)

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            filesystem(self.root_dir).makedirs(self.root_dir, exist_ok=True)
            self._experiment = ExperimentWriter(self.log_dir, resume=self._opened)
            self._opened = True
        return self._experiment

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        metrics = add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR)
        if step is None:
            step = len(self.experiment.metrics)
        self.experiment.log_metrics(metrics, step)
        if (step + 1) % self._flush_logs_every_n_steps == 0:
            self.save()

    def log_hyperparams(self, params: Any = None) -> None:
        self.experiment.log_hparams(convert_params(params))

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


_ExperimentWriter = ExperimentWriter  # the name Lightning's Fabric gives the same writer
