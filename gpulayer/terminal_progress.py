"""Progress bars for people at a terminal: a batch's jobs, a distributed job's ranks.

Shown only when stdout is a terminal; in a pipe, a log file or CI nothing
extra is written. Rich's bars, several rows at once (a bar per rank), for a client waiting on the
fleet; the Trainer's epoch bar (``trainer/progress_line.py``) is another thing: tqdm's attributes for
Lightning's callbacks, one line drawn by hand, and a finished line in a log. Redraws are throttled to about ten a second, and the batch
hook costs one clock read per polling round, so gathering stays cheap.

>>> with batch_progress(len(handle)) as tick:   # None when stdout is not a terminal
...     metas = handle._gather(None, 0.02, tick)
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO

BATCH_MIN_JOBS = 8  # a batch of more jobs than this gets a bar
REDRAW_EVERY = 0.1  # seconds; at most ~10 redraws a second
GANG_POLL_EVERY = 0.25  # seconds between reads of a distributed job's record


def _console(file: IO | None = None):
    from rich.console import Console

    return Console(file=file)


def _progress(console, *columns):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), *columns, TimeElapsedColumn(),
                    console=console, auto_refresh=False, transient=False, redirect_stdout=False,
                    redirect_stderr=False)


class _BatchTicker:
    """Called by ``BatchHandle._gather`` once per polling round with the counts so far."""

    def __init__(self, progress, task, total: int):
        self.progress, self.task, self.total = progress, task, total
        self.started = time.monotonic()
        self.next_draw = 0.0
        self.done = self.failed = 0

    def __call__(self, done: int, failed: int, final: bool = False) -> None:
        self.done, self.failed = done, failed
        now = time.monotonic()
        if now < self.next_draw and not final:
            return
        self.next_draw = now + REDRAW_EVERY
        elapsed = max(now - self.started, 1e-6)
        rate = done / elapsed
        eta = (self.total - done) / rate if rate > 0 and done < self.total else None
        self.progress.update(self.task, completed=done, failed=failed, waiting=self.total - done,
                             rate=f"{rate:,.0f}/s" if done else "-/s",
                             eta=f"ETA {eta:,.0f}s" if eta is not None else ("done" if done >= self.total else "ETA -"))
        self.progress.refresh()


@contextlib.contextmanager
def batch_progress(total: int, enabled: bool | None = None,
                   file: IO | None = None) -> Iterator[Callable[..., None] | None]:
    """A bar for a batch of ``total`` jobs: done, failed, waiting or running, rate, ETA.

    Yields the hook to call per polling round, or ``None`` (no bar) when stdout
    is not a terminal, the batch is small, or ``enabled`` is False.
    """
    console = _console(file) if enabled or (enabled is None and total > BATCH_MIN_JOBS) else None
    if enabled is None:
        enabled = console is not None and console.is_terminal
    if not enabled:
        yield None
        return
    from rich.progress import TextColumn

    progress = _progress(console, TextColumn("{task.completed}/{task.total} jobs"),
                         TextColumn("[red]{task.fields[failed]} failed"),
                         TextColumn("{task.fields[waiting]} waiting/running"), TextColumn("{task.fields[rate]}"),
                         TextColumn("{task.fields[eta]}"))
    task = progress.add_task("jobs", total=total, failed=0, waiting=total, rate="-/s", eta="ETA -")
    ticker = _BatchTicker(progress, task, total)
    progress.start()
    try:
        yield ticker
    finally:
        ticker(ticker.done, ticker.failed, final=True)
        progress.stop()


class GangProgress:
    """A distributed job's state and ranks (waiting, with the reason -> running -> done), redrawn from a
    polling thread."""

    def __init__(self, handle, file: IO | None = None, enabled: bool | None = None):
        self.handle = handle
        self.console = _console(file)
        self.enabled = self.console.is_terminal if enabled is None else enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._progress = None

    def wrap(self, stream: IO) -> IO:
        """``stream`` as the bar wants it written to: lines on the bar's terminal go above it, not through it."""
        if not self.enabled or not stream.isatty():
            return stream
        from rich.file_proxy import FileProxy

        return FileProxy(self.console, stream)

    def __enter__(self) -> GangProgress:
        if not self.enabled:
            return self
        from rich.progress import TextColumn

        world = self.handle.spec.world_size
        self._progress = _progress(self.console, TextColumn("{task.completed}/{task.total} ranks done"),
                                   TextColumn("{task.fields[running]} running"),
                                   TextColumn("[red]{task.fields[failed]} failed"))
        self._task = self._progress.add_task(f"gang {self.handle.id[:8]} waiting", total=world, running=0,
                                             failed=0)
        self._progress.start()
        self._thread = threading.Thread(target=self._poll, name="gang-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=2)
        self._draw()  # the final state
        self._progress.stop()

    def _poll(self) -> None:
        while not self._stop.wait(GANG_POLL_EVERY):
            try:
                self._draw()
            except Exception:  # a bar never breaks the job it shows
                pass

    def _draw(self) -> None:
        from .store import keys

        store, gid = self.handle.store, self.handle.id
        record = store.record(gid)
        state = record.get("state") or "waiting"
        attempt = int(record.get("attempt") or 0)
        world = self.handle.spec.world_size
        done = failed = 0
        if state != "waiting":  # count rank results without reading them (they can be large)
            done = store.r.hlen(keys.gang_attempt(gid, attempt, "results"))
            failed = len({f.get("rank") for f in store.failures(gid, attempt)})
        running = max(world - done - failed, 0) if state == "running" else 0
        label = {"succeeded": "done"}.get(state, state)
        if attempt:
            label += f" (attempt {attempt + 1})"
        where = (record.get("placement") or {}).get("workers") or []
        if state == "running" and where:
            label += " on " + ", ".join(where)
        elif state == "waiting":  # why, as `gpulayer status` says it
            why = self.handle.waiting_for()
            if why:
                label += f": {why}"
        self._progress.update(self._task, description=f"gang {gid[:8]} {label}", completed=done, running=running,
                              failed=failed)
        self._progress.refresh()
