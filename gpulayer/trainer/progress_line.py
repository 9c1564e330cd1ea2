"""A one-line progress bar with tqdm's attributes (``n``, ``total``, ``set_postfix``...), drawn sparingly.

On a terminal it redraws in place at most a few times a second. When the stream is
not a terminal (CI logs, files) it writes nothing while running and one finished
line when the bar closes or ends its line, so logs get one line per epoch instead
of thousands of carriage returns. ``TQDMProgressBar`` (callbacks/progress.py)
decides what it shows; this file only draws. ``position`` (tqdm's) draws a bar that many
lines below the cursor on a terminal, so bars of parallel processes do not overwrite each other.
Not ``gpulayer/terminal_progress.py`` (rich's bars for a batch's jobs or a distributed job's ranks, nothing at
all off a terminal): this one keeps tqdm's interface and logs one line per epoch off a terminal.
"""

from __future__ import annotations

import sys
import time
from typing import Any


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        return f"{value.item():.3g}"
    return str(value)


class LineBar:
    """``total`` (None: unknown), ``n`` (done), ``desc``, ``postfix``; ``disable=True`` draws nothing.

    ``position``: on a terminal, the bar is drawn that many lines below the cursor (tqdm's ``position``), and
    a finished line stays there in place (the cursor never moves down past it); in a log it changes nothing.
    """

    REFRESH_S = 0.25

    def __init__(self, desc: str = "", total: int | None = None, leave: bool = True, disable: bool = False,
                 stream: Any = None, position: int = 0) -> None:
        self.desc, self.total, self.leave, self.disable = desc, total, leave, disable
        self.position = position
        self.n = 0
        self.initial = 0
        self.postfix: dict[str, Any] = {}
        self.stream = stream if stream is not None else sys.stdout
        self.terminal = _is_terminal(self.stream)
        self._start = self._last = time.monotonic()
        self._shown = False  # something of this line is on the screen (a terminal)

    # -- tqdm's names ---------------------------------------------------------------------------
    def reset(self, total: int | None = None) -> None:
        """Back to 0 (tqdm's): ``total`` is replaced only when one is given."""
        self.n = 0
        if total is not None:
            self.total = total
        self._start = self._last = time.monotonic()

    def set_description(self, desc: str | None = None, refresh: bool = False) -> None:
        self.desc = f"{desc}: " if desc else ""  # tqdm keeps the separator in ``desc``

    def set_postfix(self, values: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        self.postfix = {**(values or {}), **kwargs}
        if refresh:
            self.refresh()

    def update(self, n: int = 1) -> None:
        self.n += n
        self.refresh()

    def refresh(self, force: bool = False) -> None:
        """Redraw now on a terminal when forced or when the last draw is old enough; elsewhere nothing."""
        if self.disable or not self.terminal:
            return
        now = time.monotonic()
        if not force and now - self._last < self.REFRESH_S and self.n != self.total:
            return
        self._last = now
        self._draw_at_row("\r" + self.line() + "\033[K")
        self.stream.flush()
        self._shown = True

    def _draw_at_row(self, text: str) -> None:
        """``text`` on the bar's row (``position`` lines down), the cursor back where it was."""
        p = self.position
        self.stream.write("\n" * p + text + f"\033[{p}A" if p else text)

    def due(self) -> bool:
        """A redraw would show now (a terminal, and the last draw is old enough): worth computing what it shows."""
        return not self.disable and self.terminal and time.monotonic() - self._last >= self.REFRESH_S

    def end_line(self) -> None:
        """Finish this line (an epoch's): the final numbers stay, the next draw starts below."""
        if self.disable:
            return
        if self.terminal and self.position:  # an offset row: the final numbers stay on it, in place
            self._draw_at_row("\r" + self.line() + "\033[K")
        else:
            self.stream.write(("\r" if self.terminal else "") + self.line() + ("\033[K\n" if self.terminal else "\n"))
        self.stream.flush()
        self._shown = False

    def close(self) -> None:
        """Done: keep the last line (``leave``) or clear it from the terminal; a closed bar draws no more (tqdm's)."""
        if self.disable:
            return
        if self._shown:
            if self.leave:
                self.end_line()
            else:
                self._draw_at_row("\r\033[K")
                self.stream.flush()
        self._shown = False
        self.disable = True

    def clear_line(self) -> None:
        """Take the bar off the terminal (it is drawn again on the next refresh)."""
        if self.terminal and self._shown:
            self._draw_at_row("\r\033[K")
            self._shown = False

    def write(self, text: str, **kwargs: Any) -> None:
        """Print a line without breaking the bar (it is drawn again below on the next refresh)."""
        self.clear_line()
        print(text, **{"file": self.stream, "flush": True, **kwargs})

    # -- what is drawn ---------------------------------------------------------------------------
    def line(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = (self.n - self.initial) / elapsed
        total = f"/{self.total}" if self.total is not None else ""
        shown = ", ".join(f"{k}={self._format_value(v)}" for k, v in self.postfix.items())
        desc = self.desc if not self.desc or self.desc.endswith(": ") else f"{self.desc}: "
        return f"{desc}{self.n}{total} [{elapsed:.0f}s, {rate:.2f}it/s{', ' + shown if shown else ''}]"

    def _format_value(self, value: Any) -> str:
        return _fmt(value)
