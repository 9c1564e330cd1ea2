"""Loggers: a CSV logger built in, TensorBoard when ``tensorboard`` is installed.

Only global rank 0 calls them. The Trainer hands them floats at log intervals
and epoch ends; nothing here runs per step.
"""

from __future__ import annotations

import csv
import json
import os
from typing import Any


class Logger:
    """What the Trainer needs from a logger (Lightning's names)."""

    def __init__(self, save_dir: str | os.PathLike, name: str | None = "lightning_logs", version: int | str | None = None):
        self._save_dir = os.fspath(save_dir)
        self._name = name or ""
        self._version = version

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def name(self) -> str:
        return self._name

    @property
    def root_dir(self) -> str:
        return os.path.join(self._save_dir, self._name)

    @property
    def version(self) -> int | str:
        """The next free ``version_N`` under ``root_dir``, fixed at first use."""
        if self._version is None:
            root = self.root_dir
            taken = []
            if os.path.isdir(root):
                for d in os.listdir(root):
                    if d.startswith("version_") and d[8:].isdigit():
                        taken.append(int(d[8:]))
            self._version = max(taken) + 1 if taken else 0
        return self._version

    @property
    def log_dir(self) -> str:
        v = self.version
        return os.path.join(self.root_dir, v if isinstance(v, str) else f"version_{v}")

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        pass

    def save(self) -> None:
        pass

    def finalize(self, status: str) -> None:
        self.save()


class CSVLogger(Logger):
    """``metrics.csv`` (one row per logging call; a ``step`` column) and ``hparams.json`` in ``log_dir``."""

    NAME_METRICS_FILE = "metrics.csv"

    def __init__(self, save_dir: str | os.PathLike, name: str | None = "lightning_logs", version: int | str | None = None,
                 flush_logs_every_n_steps: int = 100):
        super().__init__(save_dir, name, version)
        self.flush_logs_every_n_steps = flush_logs_every_n_steps
        self._rows: list[dict[str, Any]] = []
        self._unsaved = 0
        self._keys: list[str] = []         # every column seen, in first-seen order
        self._file_keys: list[str] = []    # the columns of the file on disk
        self._written = 0                  # rows already in the file

    @property
    def metrics_file_path(self) -> str:
        return os.path.join(self.log_dir, self.NAME_METRICS_FILE)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step, **metrics}
        self._rows.append(row)
        self._keys.extend(k for k in row if k not in self._keys)
        self._unsaved += 1
        if self._unsaved >= self.flush_logs_every_n_steps:
            self.save()

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        os.makedirs(self.log_dir, exist_ok=True)
        with open(os.path.join(self.log_dir, "hparams.json"), "w") as f:
            json.dump({k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v) for k, v in params.items()},
                      f, indent=2)

    def save(self) -> None:
        # new rows are appended; only a new column (a metric first logged at epoch end) rewrites the file
        if self._written == len(self._rows):
            return
        if self._keys == self._file_keys and os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=self._keys).writerows(self._rows[self._written:])
        else:
            os.makedirs(self.log_dir, exist_ok=True)
            tmp = self.metrics_file_path + ".tmp"
            with open(tmp, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self._keys)
                writer.writeheader()
                writer.writerows(self._rows)
            os.replace(tmp, self.metrics_file_path)
            self._file_keys = list(self._keys)
        self._written = len(self._rows)
        self._unsaved = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_rows"], state["_unsaved"], state["_keys"], state["_file_keys"], state["_written"] = [], 0, [], [], 0
        return state


class TensorBoardLogger(Logger):
    """Event files for TensorBoard; needs ``pip install tensorboard``."""

    def __init__(self, save_dir: str | os.PathLike, name: str | None = "lightning_logs", version: int | str | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as err:
            raise ImportError("TensorBoardLogger needs tensorboard: pip install tensorboard (or use CSVLogger)") from err
        super().__init__(save_dir, name, version)
        self._writer = None

    @property
    def experiment(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter
            self._writer = SummaryWriter(log_dir=self.log_dir)
        return self._writer

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.experiment.add_scalar(k, v, step)

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        self.experiment.add_text("hparams", json.dumps({k: repr(v) for k, v in params.items()}))

    def save(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def finalize(self, status: str) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_writer"] = None
        return state
