"""A one-line progress bar that redraws at most a few times a second.

It shows only numbers the Trainer has already materialised (at log intervals and
epoch ends), so drawing it never waits for the GPU.
"""

from __future__ import annotations

import sys
import time
from typing import Any


class ProgressBar:
    REFRESH_S = 0.25

    def __init__(self, stream: Any = None):
        self.stream = stream or sys.stdout
        self._last = 0.0
        self._start = 0.0
        self._total: int | None = None
        self._desc = ""

    def start_epoch(self, epoch: int, max_epochs: int, total: int | None) -> None:
        self._desc = f"Epoch {epoch}" + (f"/{max_epochs - 1}" if max_epochs > 0 else "")
        self._total = total
        self._start = self._last = time.monotonic()

    def update(self, done: int, values: dict[str, float], force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.REFRESH_S:
            return
        self._last = now
        rate = done / max(now - self._start, 1e-9)
        total = f"/{self._total}" if self._total else ""
        shown = " ".join(f"{k}={v:.4g}" for k, v in values.items())
        self.stream.write(f"\r{self._desc}: {done}{total} [{rate:.1f} it/s] {shown}\033[K")
        self.stream.flush()

    def end_epoch(self, done: int, values: dict[str, float]) -> None:
        self.update(done, values, force=True)
        self.stream.write("\n")
        self.stream.flush()
