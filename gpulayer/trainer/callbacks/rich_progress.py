"""``RichProgressBar``: Lightning's rich-drawn bar, by name (placeholder: draws gpulayer's line bar)."""

from __future__ import annotations

from typing import Any

from gpulayer.trainer.callbacks.progress import TQDMProgressBar


class RichProgressBar(TQDMProgressBar):
    def __init__(self, refresh_rate: int = 1, leave: bool = False, theme: Any = None,
                 console_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        self.theme = theme
        self._console_kwargs = console_kwargs or {}
