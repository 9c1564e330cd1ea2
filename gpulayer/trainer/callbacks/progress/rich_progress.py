"""``RichProgressBar``: the progress bars drawn with ``rich`` (``pip install rich``).

One ``rich`` ``Progress`` display per stage holds a task per bar: the sanity check, each training epoch (reset in
place, or a new display per epoch with ``leave=True``), each validation run, test and predict. The counts move at
each batch end; the metrics column shows ``get_metrics`` as of the last training batch, validation end or epoch
end, so rendering (in a background thread that redraws only after a change, at most ``refresh_rate`` times a
second) never reads the Trainer's metrics itself. ``rich`` is imported when a bar is first drawn (or when one of
the rich classes below is looked up), so ``import gpulayer.trainer`` does not load it.

Lightning's module path ``callbacks.progress.rich_progress`` is this module (registered below).
"""

from __future__ import annotations

import math
import sys
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from gpulayer.trainer.callbacks.progress.progress_bar import ProgressBar
from gpulayer.trainer.utilities.collections import apply_to_collection
from gpulayer.trainer.utilities.imports import _RICH_AVAILABLE

# the names built on rich's classes, made on first use (module __getattr__) so that tests and users can patch them
_RICH_NAMES = ("Progress", "CustomProgress", "CustomBarColumn", "BatchesProcessedColumn", "CustomTimeColumn",
               "ProcessingSpeedColumn", "MetricsTextColumn", "TextColumn")


@dataclass
class RichProgressBarTheme:
    """Styles of the bar's parts (rich style strings or ``rich.style.Style``).

    ``description`` (the "Epoch 3/9" text), ``progress_bar`` / ``progress_bar_finished`` / ``progress_bar_pulse``
    (the bar; pulse: a loader without a length), ``batch_progress`` ("10/50"), ``time``, ``processing_speed``,
    ``metrics``; ``metrics_text_delimiter`` between metrics and ``metrics_format`` for their numbers.
    """

    description: Any = ""
    progress_bar: Any = "#6206E0"
    progress_bar_finished: Any = "#6206E0"
    progress_bar_pulse: Any = "#6206E0"
    batch_progress: Any = ""
    time: Any = "dim"
    processing_speed: Any = "dim underline"
    metrics: Any = "italic"
    metrics_text_delimiter: str = " "
    metrics_format: str = ".3f"


def _build_rich_classes() -> None:
    """Define the rich-based classes into this module's namespace (once)."""
    namespace = globals()
    if "CustomProgress" in namespace:
        return
    from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn
    from rich.progress_bar import ProgressBar as RichBar
    from rich.text import Text

    class _ChangedRefreshThread(threading.Thread):
        """Redraws the display at most ``rate`` times a second, and only when something changed since the last."""

        def __init__(self, live: Any, rate: float) -> None:
            super().__init__(daemon=True)
            self.live, self.interval = live, 1 / rate
            self.changed = False
            self.done = threading.Event()

        def stop(self) -> None:
            self.done.set()

        def run(self) -> None:
            while not self.done.wait(self.interval):
                if self.changed:
                    self.changed = False
                    with self.live._lock:
                        if not self.done.is_set():
                            self.live.refresh()

    class CustomProgress(Progress):
        """``rich`` ``Progress`` that takes infinite totals (a loader without a length) and redraws on change."""

        def start(self) -> None:
            live = self.live
            if not live.auto_refresh:
                return super().start()
            live.auto_refresh = False  # start without rich's redraw-always thread...
            super().start()
            live.auto_refresh = True  # ...and with ours, which Live.stop() stops
            live._refresh_thread = _ChangedRefreshThread(live, live.refresh_per_second)
            live._refresh_thread.start()

        def stop(self) -> None:
            thread = self.live._refresh_thread
            super().stop()
            if isinstance(thread, _ChangedRefreshThread):  # Live.stop() stopped it unless stop was replaced
                thread.stop()
                thread.join()

        def mark_changed(self) -> None:
            thread = self.live._refresh_thread
            if isinstance(thread, _ChangedRefreshThread):
                thread.changed = True

    class CustomBarColumn(BarColumn):
        """A bar that pulses when the total is unknown (``inf``) instead of failing."""

        def render(self, task: Task) -> RichBar:
            total = task.total if task.total is not None else float("inf")
            finite = math.isfinite(total)
            return RichBar(total=max(0, total) if finite else None, completed=max(0, task.completed),
                           width=None if self.bar_width is None else max(1, self.bar_width),
                           pulse=not task.started or not finite, animation_time=task.get_time(), style=self.style,
                           complete_style=self.complete_style, finished_style=self.finished_style,
                           pulse_style=self.pulse_style)

    class CustomTimeColumn(ProgressColumn):
        """Elapsed and remaining time, ``h:mm:ss • h:mm:ss``."""

        max_refresh = 0.5  # a steadier clock

        def __init__(self, style: Any) -> None:
            self.style = style
            super().__init__()

        def render(self, task: Task) -> Text:
            elapsed = task.finished_time if task.finished else task.elapsed
            remaining = task.time_remaining if task.total is not None and math.isfinite(task.total) else None
            show = lambda s: "-:--:--" if s is None else str(timedelta(seconds=int(s)))
            return Text(f"{show(elapsed)} • {show(remaining)}", style=self.style)

    class BatchesProcessedColumn(ProgressColumn):
        """``done/total`` batches (``--`` for an unknown total)."""

        def __init__(self, style: Any) -> None:
            self.style = style
            super().__init__()

        def render(self, task: Task) -> Text:
            total = "--" if task.total is None or not math.isfinite(task.total) else int(task.total)
            return Text(f"{int(task.completed)}/{total}", style=self.style)

    class ProcessingSpeedColumn(ProgressColumn):
        """Batches per second."""

        def __init__(self, style: Any) -> None:
            self.style = style
            super().__init__()

        def render(self, task: Task) -> Text:
            return Text(f"{task.speed or 0.0:>.2f}it/s", style=self.style)

    class MetricsTextColumn(ProgressColumn):
        """The metrics handed to ``update``, on the training task of a fit only."""

        def __init__(self, trainer: Any, style: Any, text_delimiter: str, metrics_format: str) -> None:
            self._trainer = trainer
            self._metrics: dict[str, Any] = {}
            self._style, self._text_delimiter, self._metrics_format = style, text_delimiter, metrics_format
            super().__init__()

        def update(self, metrics: dict[str, Any]) -> None:
            self._metrics = metrics

        def render(self, task: Task) -> Text:
            trainer = self._trainer
            bar = getattr(trainer, "progress_bar_callback", None)
            if trainer.state.fn != "fit" or trainer.sanity_checking or getattr(bar, "train_progress_bar_id",
                                                                               None) != task.id:
                return Text()
            return Text(self._text_delimiter.join(self._texts()), justify="left", style=self._style)

        def _texts(self) -> Any:
            for name, value in self._metrics.items():
                if not isinstance(value, str):
                    try:
                        value = f"{value:{self._metrics_format}}"
                    except (TypeError, ValueError):
                        value = str(value)
                yield f"{name}: {value}"

    for cls in (CustomProgress, CustomBarColumn, CustomTimeColumn, BatchesProcessedColumn, ProcessingSpeedColumn,
                MetricsTextColumn):
        cls.__module__ = __name__
    namespace.update(Progress=Progress, TextColumn=TextColumn, CustomProgress=CustomProgress,
                     CustomBarColumn=CustomBarColumn, CustomTimeColumn=CustomTimeColumn,
                     BatchesProcessedColumn=BatchesProcessedColumn, ProcessingSpeedColumn=ProcessingSpeedColumn,
                     MetricsTextColumn=MetricsTextColumn)


def __getattr__(name: str) -> Any:
    if name in _RICH_NAMES and _RICH_AVAILABLE:
        _build_rich_classes()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _rich(name: str) -> Any:
    """The rich-based class ``name`` as this module holds it now (a patched one in tests)."""
    _build_rich_classes()
    return globals()[name]


class RichProgressBar(ProgressBar):
    """Progress bars drawn with ``rich``.

    ``refresh_rate``: redraws per second at most (0 turns the bars off); ``leave``: keep each finished epoch's
    bar on screen; ``theme``: a ``RichProgressBarTheme``; ``console_kwargs``: arguments of ``rich``'s
    ``Console``. Override ``configure_columns`` for other columns (the metrics column is always added last).

    >>> Trainer(callbacks=RichProgressBar(leave=True))   # doctest: +SKIP
    """

    def __init__(self, refresh_rate: int = 100, leave: bool = False, theme: RichProgressBarTheme | None = None,
                 console_kwargs: dict[str, Any] | None = None) -> None:
        if not _RICH_AVAILABLE:
            raise ModuleNotFoundError(
                "`RichProgressBar` requires `rich` >= 10.2.2. Install it by running `pip install -U rich`.")
        super().__init__()
        self._refresh_rate = refresh_rate
        self._leave = leave
        self._console_kwargs = console_kwargs or {}
        self._console: Any = None
        self._enabled = True
        self.progress: Any = None
        self._metric_component: Any = None
        self._progress_stopped = False
        self.theme = theme if theme is not None else RichProgressBarTheme()
        self._reset_progress_bar_ids()

    refresh_rate = property(lambda self: self._refresh_rate)

    @property
    def is_enabled(self) -> bool:
        return self._enabled and self.refresh_rate > 0

    @property
    def is_disabled(self) -> bool:
        return not self.is_enabled

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _task(self, task_id: Any) -> Any:
        assert self.progress is not None and task_id is not None, "that bar has not been drawn yet"
        return self.progress.tasks[task_id]

    train_progress_bar = property(lambda self: self._task(self.train_progress_bar_id))
    val_sanity_check_bar = property(lambda self: self._task(self.val_sanity_progress_bar_id))
    val_progress_bar = property(lambda self: self._task(self.val_progress_bar_id))
    test_progress_bar = property(lambda self: self._task(self.test_progress_bar_id))

    # -- the display ------------------------------------------------------------------------------
    def configure_columns(self, trainer: Any) -> list:
        """The columns before the metrics: description, bar, ``done/total``, times, speed."""
        theme = self.theme
        return [
            _rich("TextColumn")("[progress.description]{task.description}"),
            _rich("CustomBarColumn")(complete_style=theme.progress_bar, finished_style=theme.progress_bar_finished,
                                     pulse_style=theme.progress_bar_pulse),
            _rich("BatchesProcessedColumn")(style=theme.batch_progress),
            _rich("CustomTimeColumn")(style=theme.time),
            _rich("ProcessingSpeedColumn")(style=theme.processing_speed),
        ]

    def _init_progress(self, trainer: Any) -> None:
        """Start a display unless one is running (a stage after a finished one gets a new display)."""
        if not self.is_enabled or (self.progress is not None and not self._progress_stopped):
            return
        import rich

        self._reset_progress_bar_ids()
        rich.reconfigure(**self._console_kwargs)
        self._console = rich.get_console()
        while getattr(self._console, "_live_stack", None):  # a display left by an earlier run (rich >= 14.1)
            self._console.clear_live()
        self._metric_component = _rich("MetricsTextColumn")(trainer, self.theme.metrics,
                                                            self.theme.metrics_text_delimiter,
                                                            self.theme.metrics_format)
        self.progress = _rich("CustomProgress")(*self.configure_columns(trainer), self._metric_component,
                                                auto_refresh=True, refresh_per_second=self.refresh_rate,
                                                disable=self.is_disabled, console=self._console)
        self.progress.start()
        self._progress_stopped = False

    def _stop_progress(self) -> None:
        if self.progress is not None and not self._progress_stopped:
            self.progress.stop()
            self._progress_stopped = True  # the next stage starts a new display

    def _reset_progress_bar_ids(self) -> None:
        self.train_progress_bar_id: Any = None
        self.val_sanity_progress_bar_id: Any = None
        self.val_progress_bar_id: Any = None
        self.test_progress_bar_id: Any = None
        self.predict_progress_bar_id: Any = None

    def refresh(self, hard: bool = False) -> None:
        if self.progress is None:
            return
        if hard:
            self.progress.refresh()
        elif hasattr(self.progress, "mark_changed"):
            self.progress.mark_changed()

    def _add_task(self, total: int | float, description: str, visible: bool = True) -> Any:
        if self.theme.description:
            description = f"[{self.theme.description}]{description}"
        return self.progress.add_task(description, total=total, visible=visible)

    def _hide(self, task_id: Any) -> None:
        self.progress.update(task_id, advance=0, visible=False)

    def _update(self, task_id: Any, current: int, visible: bool = True, hard: bool = False) -> None:
        if self.progress is not None and self.is_enabled and task_id is not None:
            self.progress.update(task_id, completed=current, visible=visible)
            self.refresh(hard=hard)

    def _get_train_description(self, current_epoch: int) -> str:
        text = f"Epoch {current_epoch}"
        if self.trainer.max_epochs is not None:
            text += f"/{self.trainer.max_epochs - 1}"
        # as wide as "Validation", so the bars do not jump when one replaces the other
        return f"{text:{len(self.validation_description)}}"

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        """The base's items with tensors as Python numbers (rich formats them)."""
        return apply_to_collection(super().get_metrics(trainer, pl_module), torch.Tensor, lambda t: t.item())

    def _update_metrics(self, trainer: Any, pl_module: Any) -> None:
        if self.is_enabled and self._metric_component is not None:
            self._metric_component.update(self.get_metrics(trainer, pl_module))

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """Print above the bars."""
        console = self._console if self.progress is not None and not self._progress_stopped else None
        if console is None:
            print(*args, sep=sep, **kwargs)
        else:
            console.print(*args, sep=sep, **kwargs)

    # -- the hooks --------------------------------------------------------------------------------
    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self._init_progress(trainer)

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        if self.progress is not None and self.val_sanity_progress_bar_id is not None:
            self._hide(self.val_sanity_progress_bar_id)
        self.refresh()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._init_progress(trainer)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.is_disabled:
            return
        total, description = self.total_train_batches, self._get_train_description(trainer.current_epoch)
        if self.train_progress_bar_id is not None and self._leave:  # keep the finished epoch's display
            self._stop_progress()
            self._init_progress(trainer)
        if self.progress is not None:
            if self.train_progress_bar_id is None:
                self.train_progress_bar_id = self._add_task(total, description)
            else:
                self.progress.reset(self.train_progress_bar_id, total=total, description=description, visible=True)
        self.refresh()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.is_enabled and self.train_progress_bar_id is None and self.progress is not None:
            # resumed in the middle of an epoch: no epoch start drew the bar
            self.train_progress_bar_id = self._add_task(self.total_train_batches,
                                                        self._get_train_description(trainer.current_epoch))
        self._update(self.train_progress_bar_id, batch_idx + 1)
        self._update_metrics(trainer, pl_module)
        self.refresh()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._update_metrics(trainer, pl_module)
        self.refresh()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._init_progress(trainer)

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        if self.is_disabled or self.progress is None or not self.has_dataloader_changed(dataloader_idx):
            return
        total = self.total_val_batches_current_dataloader
        if trainer.sanity_checking:
            if self.val_sanity_progress_bar_id is not None:
                self._hide(self.val_sanity_progress_bar_id)
            self.val_sanity_progress_bar_id = self._add_task(total, self.sanity_check_description, visible=False)
        else:
            if self.val_progress_bar_id is not None:
                self._hide(self.val_progress_bar_id)
            self.val_progress_bar_id = self._add_task(total, self.validation_description, visible=False)
        self.refresh()

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if self.is_disabled:
            return
        task = self.val_sanity_progress_bar_id if trainer.sanity_checking else self.val_progress_bar_id
        self._update(task, batch_idx + 1)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.is_enabled and self.val_progress_bar_id is not None and trainer.state.fn == "fit":
            self._hide(self.val_progress_bar_id)
            self.refresh()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.state.fn == "fit":
            self._update_metrics(trainer, pl_module)
        self.reset_dataloader_idx_tracker()

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._init_progress(trainer)

    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        if self.is_disabled or self.progress is None or not self.has_dataloader_changed(dataloader_idx):
            return
        if self.test_progress_bar_id is not None:
            self._hide(self.test_progress_bar_id)
        self.test_progress_bar_id = self._add_task(self.total_test_batches_current_dataloader, self.test_description)
        self.refresh()

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        if self.is_enabled:
            self._update(self.test_progress_bar_id, batch_idx + 1)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self.reset_dataloader_idx_tracker()

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self._init_progress(trainer)

    def on_predict_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        if self.is_disabled or self.progress is None or not self.has_dataloader_changed(dataloader_idx):
            return
        if self.predict_progress_bar_id is not None:
            self._hide(self.predict_progress_bar_id)
        self.predict_progress_bar_id = self._add_task(self.total_predict_batches_current_dataloader,
                                                      self.predict_description)
        self.refresh()

    def on_predict_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:
        if self.is_enabled:
            self._update(self.predict_progress_bar_id, batch_idx + 1)

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self.reset_dataloader_idx_tracker()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._stop_progress()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._stop_progress()

    def __getstate__(self) -> dict[str, Any]:
        # the display and the console hold locks and threads; a copy (a rank's, a checkpoint's) draws its own
        return {**super().__getstate__(), "progress": None, "_console": None, "_metric_component": None}


