"""``Profiler``: the base of the profilers (Lightning's ``profilers.profiler``)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterator

from gpulayer.trainer.utilities.rank_zero import rank_zero_only

log = logging.getLogger(__name__)
_UNSAFE = re.compile(r'[\\/:*?"<>|\n\r\t]')  # not allowed in a file name somewhere


def _report(text: str) -> None:
    """To the log when logging is set up (as Lightning's logger gets it), else to stdout: it was asked for."""
    if log.isEnabledFor(logging.INFO) and log.hasHandlers():
        log.info(text)
    else:
        print(text)


class Profiler(ABC):
    """Base of the profilers: ``start`` / ``stop`` an action, ``profile(action)``, ``summary()``, ``describe()``."""

    def __init__(self, dirpath: str | os.PathLike | None = None, filename: str | None = None) -> None:
        self.dirpath = dirpath
        self.filename = filename
        self._output_file: io.TextIOBase | None = None
        self._write_stream: Callable[[str], Any] | None = None
        self._stage: str | None = None
        self._local_rank: int | None = None
        self._lightning_module: Any = None  # the module of the stage running, set by the Trainer (as Lightning's)

    @abstractmethod
    def start(self, action_name: str) -> None:
        """Begin recording ``action_name``."""

    @abstractmethod
    def stop(self, action_name: str) -> None:
        """End recording ``action_name``."""

    def summary(self) -> str:
        return ""

    @contextlib.contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        """``with profiler.profile("load"): ...`` records the block as one call of ``load``."""
        try:
            self.start(action_name)
            yield action_name
        finally:
            self.stop(action_name)

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """Called by the Trainer before a stage runs; the summary goes under ``log_dir`` unless ``dirpath`` is set."""
        self._stage, self._local_rank = stage, local_rank
        self.dirpath = self.dirpath or log_dir

    def teardown(self, stage: str | None) -> None:
        """Close the summary file after a stage."""
        self._write_stream = None
        if self._output_file is not None:
            self._output_file.close()
            self._output_file = None

    def describe(self) -> None:
        """Write the summary (a file when ``filename`` is set, else the log), then tear down."""
        self._prepare_streams()  # as Lightning: the file exists after a stage, empty when nothing was recorded
        text = self.summary()
        if text:
            self._write_stream(text)
        if self._output_file is not None:
            self._output_file.flush()
        self.teardown(stage=self._stage)

    def _stats_to_str(self, stats: dict[str, str]) -> str:
        """``FIT Profiler Report`` then each entry under ``Profile stats for: <name>`` (and the rank)."""
        lines = [f"{self._stage.upper()} Profiler Report" if self._stage else "Profiler Report"]
        rank = f" rank: {self._local_rank}" if self._local_rank is not None else ""
        for name, text in stats.items():
            lines += [f"Profile stats for: {name}{rank}", text]
        return os.linesep.join(lines)

    @property
    def local_rank(self) -> int:
        return self._local_rank or 0

    def _prepare_filename(self, action_name: str | None = None, extension: str = ".txt") -> str:
        """``<stage>-<filename>-<rank>-<action>``, filesystem-safe: an action name may hold a path separator."""
        parts = [p for p in (self._stage, self.filename) if p]
        if self._local_rank is not None:
            parts.append(str(self._local_rank))
        if action_name is not None:
            parts.append(action_name)
        base = _UNSAFE.sub("_", "-".join(parts))
        return (re.sub(r"_+", "_", base).strip() or "profile") + extension

    def _prepare_streams(self) -> None:
        if self._write_stream is not None:
            return
        if self.filename and self.dirpath:
            os.makedirs(self.dirpath, exist_ok=True)
            self._output_file = open(os.path.join(self.dirpath, self._prepare_filename()), "a")  # noqa: SIM115
            self._write_stream = self._output_file.write
        else:  # the report was asked for: shown on rank 0's stdout (Lightning's logger prints it there too)
            self._write_stream = rank_zero_only(_report)

    def __getstate__(self) -> dict[str, Any]:
        # a copy travels to the ranks of a multi-process run: open files stay here
        return {**self.__dict__, "_output_file": None, "_write_stream": None, "_lightning_module": None}

    def __del__(self) -> None:
        if getattr(self, "_output_file", None) is not None:
            self._output_file.close()
