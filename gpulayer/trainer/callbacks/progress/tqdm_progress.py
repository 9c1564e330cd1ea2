"""Progress-bar callbacks (Lightning's ``callbacks.progress.tqdm_progress``): ``ProgressBar`` and the default
``TQDMProgressBar``, drawing ``Tqdm`` bars.

The Trainer adds a ``TQDMProgressBar`` when ``enable_progress_bar=True`` (the default)
and none is in ``callbacks``; ``trainer.progress_bar_callback`` is that object. Its bars are
``Tqdm``: gpulayer's own line bar (progress_line.py) with tqdm's names, in place on a terminal,
a few times a second at most; elsewhere one line per training epoch. What a batch's update shows
comes from ``get_metrics``, read only when a line is drawn, so the bar adds no device sync per
step (Lightning reads it at every update); at the end of a validation and of a training epoch it
is read, as Lightning does. The bars are made through this module's ``Tqdm`` name at the time, so a
subclass (or a test's stand-in) put there is used.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from typing import Any

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.errors import TrainerConfigError
from gpulayer.trainer.progress_line import LineBar

_PAD_SIZE = 5  # a float in the bar is padded with zeros to this many characters ("1.000", "0.100")


class Tqdm(LineBar):
    """A bar with tqdm's constructor, attributes and methods (``n``, ``total``, ``desc``, ``reset``,
    ``set_postfix``, ``write``); ``format_num`` pads floats so the postfix does not jitter."""

    def __init__(self, *args: Any, desc: str | None = None, total: int | None = None, leave: bool = True,
                 file: Any = None, disable: bool = False, position: int | None = None, **kwargs: Any) -> None:
        if args:  # tqdm's positional order: iterable, desc, total, leave, file
            desc = args[1] if len(args) > 1 else desc
        super().__init__(desc=desc or "", total=total, leave=leave, disable=disable, stream=file,
                         position=position or 0)

    @staticmethod
    def format_num(n: Any) -> str:
        """tqdm's compact number (3 significant digits or ``str``, whichever is shorter), a float (or a string of
        one) padded with zeros to 5 characters unless it is in exponent form."""
        padded = isinstance(n, (float, str))
        if not isinstance(n, str):
            compact = f"{n:.3g}".replace("+0", "+").replace("-0", "-")
            n = compact if len(compact) < len(str(n)) else str(n)
        if padded and "e" not in n:
            if "." not in n and len(n) < _PAD_SIZE:
                try:
                    float(n)
                except ValueError:
                    return n
                n += "."
            n += "0" * (_PAD_SIZE - len(n))
        return n

    def _format_value(self, value: Any) -> str:
        if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
            value = value.item()
        return self.format_num(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
            else str(value)

    def write(self, s: str, **kwargs: Any) -> None:
        """Print ``s`` without breaking the bar: the line is cleared first and drawn again on the next refresh. The
        text goes through ``tqdm.write`` when tqdm is installed (so tqdm bars of other code stay intact too)."""
        self.clear_line()
        try:
            import tqdm
        except ImportError:
            print(s, **kwargs)
            return
        tqdm.tqdm.write(s, **kwargs)


class ProgressBar(Callback):
    """Base of progress bars: the totals a bar shows, ``get_metrics``, ``enable`` / ``disable``.

    Subclass it for your own bar: override the hooks you draw in and ``enable`` / ``disable``.
    """

    def __init__(self) -> None:
        self._trainer = None
        self._current_eval_dataloader_idx: int | None = None

    @property
    def trainer(self):
        """The trainer this bar belongs to (set in ``setup``)."""
        if self._trainer is None:
            raise TypeError(f"The `{type(self).__name__}._trainer` reference has not been set yet.")
        return self._trainer

    sanity_check_description = property(lambda self: "Sanity Checking")
    train_description = property(lambda self: "Training")
    validation_description = property(lambda self: "Validation")
    test_description = property(lambda self: "Testing")
    predict_description = property(lambda self: "Predicting")

    @property
    def total_train_batches(self) -> int | float:
        """This epoch's training batches (``inf`` for a loader without a length); with ``max_epochs=-1`` and
        ``max_steps``, at most the steps left."""
        trainer = self.trainer
        if trainer.max_epochs == -1 and trainer.max_steps is not None and trainer.max_steps > 0:
            return min(trainer.num_training_batches, trainer.max_steps - trainer.global_step)
        return trainer.num_training_batches

    def _current(self, batches: Any) -> int | float:
        if isinstance(batches, list):
            return batches[self._current_eval_dataloader_idx or 0] if batches else 0
        return batches

    @property
    def total_val_batches_current_dataloader(self) -> int | float:
        trainer = self.trainer
        return self._current(trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches)

    @property
    def total_test_batches_current_dataloader(self) -> int | float:
        return self._current(self.trainer.num_test_batches)

    @property
    def total_predict_batches_current_dataloader(self) -> int | float:
        return self._current(self.trainer.num_predict_batches)

    @property
    def total_val_batches(self) -> int | float:
        """Validation batches of all loaders in this epoch: 0 when the fit does not validate in it."""
        trainer = self.trainer
        loop = getattr(trainer, "loop", None)
        if loop is not None and trainer.state_stage == "fit" and not loop.val_epoch():
            return 0
        batches = trainer.num_val_batches
        return sum(batches) if isinstance(batches, list) else batches

    def has_dataloader_changed(self, dataloader_idx: int) -> bool:
        previous, self._current_eval_dataloader_idx = self._current_eval_dataloader_idx, dataloader_idx
        return previous != dataloader_idx

    def reset_dataloader_idx_tracker(self) -> None:
        self._current_eval_dataloader_idx = None

    def disable(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must say how it is turned off (override disable)")

    def enable(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must say how it is turned on (override enable)")

    def print(self, *args: Any, **kwargs: Any) -> None:
        print(*args, **kwargs)

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._trainer = trainer
        if not trainer.is_global_zero:
            self.disable()

    def __getstate__(self) -> dict[str, Any]:
        # copies sent to the ranks of a multi-process run leave this process's trainer behind
        return {**super().__getstate__(), "_trainer": None}

    def get_metrics(self, trainer, pl_module) -> dict[str, Any]:
        """What the bar shows after the counts: ``v_num`` (the logger's version) and the ``prog_bar=True`` values.

        Override it to change the items, e.g. ``items = super().get_metrics(trainer, pl_module);
        items.pop("v_num", None)``.
        """
        standard = standard_metrics(trainer)
        shown = trainer.progress_bar_metrics
        clash = sorted(standard.keys() & shown.keys())
        if clash:
            warnings.warn(
                f"The progress bar already tracks a metric with the name(s) '{', '.join(clash)}' and "
                f"`self.log('{clash[0]}', ..., prog_bar=True)` will overwrite this value.  If this is undesired, "
                "change the name or override `get_metrics()` in the progress bar callback.", stacklevel=2)
        return {**standard, **shown}


def standard_metrics(trainer) -> dict[str, Any]:
    """``{"v_num": version}`` when a logger has a version (the last 4 characters of a string one), else empty."""
    loggers = trainer.loggers
    if not loggers:
        return {}
    # one logger: its version as is; several: their distinct versions joined with "_"
    version = loggers[0].version if len(loggers) == 1 else "_".join(dict.fromkeys(str(lg.version) for lg in loggers))
    if version in ("", None):
        return {}
    return {"v_num": version[-4:] if isinstance(version, str) else version}


def _total(x: int | float | None) -> int | None:
    """A bar's total: None for an unknown or infinite count."""
    return None if x is None or math.isinf(x) or math.isnan(x) else int(x)


class TQDMProgressBar(ProgressBar):
    """The default bar: a line for training (per epoch), a passing line for validation, test and predict.

    ``refresh_rate``: update every this many batches (0 turns the bar off); on Colab a rate of 1 becomes
    20, and ``TQDM_MINITERS`` raises it, as Lightning does. ``leave``, on a terminal: ``True`` keeps each
    finished epoch's line on screen (a new bar per epoch, as Lightning); ``False`` (the default) draws the next
    epoch over it, and the last epoch's line stays when training ends. A log (not a terminal) cannot erase, so
    it gets one line per epoch either way. ``process_position``: the bars are drawn this many lines below the
    cursor on a terminal (tqdm's ``position``), for several processes training side by side; gpulayer's bars
    share one line per process (validation passes over the training line), so ``process_position=k`` is
    the k-th process's line. ``train_progress_bar`` and friends have tqdm's attributes (``n``, ``total``,
    ``postfix``).
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False):
        super().__init__()
        if isinstance(refresh_rate, bool) or not isinstance(refresh_rate, int) or refresh_rate < 0:
            raise TrainerConfigError(f"TQDMProgressBar(refresh_rate={refresh_rate!r}) must be an int >= 0")
        if isinstance(process_position, bool) or not isinstance(process_position, int) or process_position < 0:
            raise TrainerConfigError(f"TQDMProgressBar(process_position={process_position!r}) must be an int >= 0 "
                                     "(the lines below the cursor this process's bar is drawn on)")
        self._refresh_rate = self._resolve_refresh_rate(refresh_rate)
        self._process_position = process_position
        self._enabled = True
        self._leave = leave
        self._bars: dict[str, Tqdm | None] = {"train": None, "val": None, "test": None, "predict": None}

    @staticmethod
    def _resolve_refresh_rate(refresh_rate: int) -> int:
        if os.getenv("COLAB_GPU") and refresh_rate == 1:
            return 20  # frequent redraws crash Colab's output
        if "TQDM_MINITERS" in os.environ:
            return max(int(os.environ["TQDM_MINITERS"]), refresh_rate)
        return refresh_rate

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_bars": dict.fromkeys(self._bars)}  # bars hold this process's stdout

    refresh_rate = property(lambda self: self._refresh_rate)
    process_position = property(lambda self: self._process_position)

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

    def _bar(self, kind: str) -> Tqdm:
        bar = self._bars[kind]
        if bar is None:
            raise TypeError(f"The `{type(self).__name__}.{kind}_progress_bar` reference has not been set yet.")
        return bar

    def _set_bar(self, kind: str, bar: Tqdm | None) -> None:
        self._bars[kind] = bar

    train_progress_bar = property(lambda self: self._bar("train"), lambda self, b: self._set_bar("train", b))
    val_progress_bar = property(lambda self: self._bar("val"), lambda self, b: self._set_bar("val", b))
    test_progress_bar = property(lambda self: self._bar("test"), lambda self, b: self._set_bar("test", b))
    predict_progress_bar = property(lambda self: self._bar("predict"), lambda self, b: self._set_bar("predict", b))

    def _new_bar(self, desc: str, leave: bool) -> Tqdm:
        import gpulayer.trainer.callbacks.progress.tqdm_progress as this  # the name as it is now (patchable)
        # one line per process (validation passes over the training line), so the k-th process draws k lines down
        return this.Tqdm(desc=desc, position=self.process_position, disable=self.is_disabled, leave=leave,
                         dynamic_ncols=True, file=sys.stdout)

    def init_sanity_tqdm(self) -> Tqdm:
        return self._new_bar(self.sanity_check_description, leave=False)

    def init_train_tqdm(self) -> Tqdm:
        return self._new_bar(self.train_description, leave=True)

    def init_validation_tqdm(self) -> Tqdm:
        has_main_bar = self.trainer.state.fn != "validate"  # under a training bar: it passes
        return self._new_bar(self.validation_description, leave=not has_main_bar)

    def init_test_tqdm(self) -> Tqdm:
        return self._new_bar(self.test_description, leave=True)

    def init_predict_tqdm(self) -> Tqdm:
        return self._new_bar(self.predict_description, leave=True)

    def _should_update(self, current: int, total: int | None) -> bool:
        return self.is_enabled and (current % self.refresh_rate == 0 or current == total)

    # -- training ------------------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        self.train_progress_bar = self.init_train_tqdm()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self._leave:  # each epoch's bar is its own, kept when the epoch ends (Lightning's)
            self.train_progress_bar = self.init_train_tqdm()
        bar = self.train_progress_bar
        bar.reset()
        bar.total = _total(self.total_train_batches)
        bar.initial = 0
        bar.set_description(f"Epoch {trainer.current_epoch}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        n = batch_idx + 1
        bar = self._bars["train"]
        if bar is not None and self._should_update(n, bar.total) and not bar.disable:
            bar.n = n
            if bar.due():  # the metrics are read (and made numbers) only for a line that is drawn
                bar.set_postfix(self.get_metrics(trainer, pl_module))
            else:
                bar.refresh()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        bar = self.train_progress_bar
        if not bar.disable:
            bar.n = max(bar.n, trainer.loop.batches_done if getattr(trainer, "loop", None) else bar.n)
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            if self._leave or not bar.terminal:
                bar.end_line()  # kept; a log gets the line either way (it cannot erase)
            else:
                bar.refresh(force=True)  # leave=False: the final numbers, in place; the next epoch draws over them

    def on_train_end(self, trainer, pl_module) -> None:
        self.train_progress_bar.close()

    # -- evaluation: a passing line on a terminal, nothing elsewhere -------------------------------
    def _eval_start(self, kind: str, init) -> None:
        self.reset_dataloader_idx_tracker()
        self._set_bar(kind, init())

    def _eval_batch_start(self, kind: str, total_fn, dataloader_idx: int) -> None:
        bar = self._bars[kind]
        if bar is None or not self.has_dataloader_changed(dataloader_idx):
            return
        bar.reset()
        bar.total = _total(total_fn())
        suffix = f" DataLoader {dataloader_idx}" if self._many_loaders(kind) else ""
        bar.set_description(f"{self._description(kind)}{suffix}")

    def _eval_batch_end(self, kind: str, total_fn, trainer, pl_module, batch_idx: int, dataloader_idx: int) -> None:
        bar = self._bars[kind]
        if bar is None:
            return
        n = batch_idx + 1
        if self._should_update(n, bar.total) and not bar.disable:
            bar.n = n
            if bar.due():
                bar.set_postfix(self.get_metrics(trainer, pl_module) if kind != "predict" else {})
            else:
                bar.refresh()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._eval_batch_start("val", lambda: self.total_val_batches_current_dataloader, dataloader_idx)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._eval_batch_start("test", lambda: self.total_test_batches_current_dataloader, dataloader_idx)

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._eval_batch_start("predict", lambda: self.total_predict_batches_current_dataloader, dataloader_idx)

    def _description(self, kind: str) -> str:
        if kind == "val" and self.trainer.sanity_checking:
            return self.sanity_check_description
        return {"val": self.validation_description, "test": self.test_description,
                "predict": self.predict_description}[kind]

    def _many_loaders(self, kind: str) -> bool:
        t = self.trainer
        counts = {"val": t.num_val_batches, "test": t.num_test_batches, "predict": t.num_predict_batches}[kind]
        return isinstance(counts, list) and len(counts) > 1

    def _eval_end(self, kind: str) -> None:
        bar = self._bars[kind]
        if bar is not None:
            bar.close()
        self.reset_dataloader_idx_tracker()

    def on_sanity_check_start(self, trainer, pl_module) -> None:
        self._eval_start("val", self.init_sanity_tqdm)
        if self._bars["train"] is None:  # as Lightning: a training bar that draws nothing until training starts
            self._set_bar("train", self._new_bar(self.train_description, leave=False))
            self._bars["train"].disable = True

    def on_sanity_check_end(self, trainer, pl_module) -> None:
        self._eval_end("val")
        train = self._bars["train"]
        if train is not None and train.disable:
            train.close()

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._eval_start("val", self.init_validation_tqdm)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._eval_batch_end("val", lambda: self.total_val_batches_current_dataloader, trainer, pl_module, batch_idx,
                             dataloader_idx)

    def on_validation_end(self, trainer, pl_module) -> None:
        train = self._bars["train"]
        if train is not None and trainer.state.fn == "fit":
            train.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)  # the values validation logged
        if not trainer.sanity_checking:
            self._eval_end("val")

    def on_test_start(self, trainer, pl_module) -> None:
        self._eval_start("test", self.init_test_tqdm)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._eval_batch_end("test", lambda: self.total_test_batches_current_dataloader, trainer, pl_module, batch_idx,
                             dataloader_idx)

    def on_test_end(self, trainer, pl_module) -> None:
        self._eval_end("test")

    def on_predict_start(self, trainer, pl_module) -> None:
        self._eval_start("predict", self.init_predict_tqdm)

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._eval_batch_end("predict", lambda: self.total_predict_batches_current_dataloader, trainer, pl_module,
                             batch_idx, dataloader_idx)

    def on_predict_end(self, trainer, pl_module) -> None:
        self._eval_end("predict")

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """Print without breaking the bar that is being drawn (through its ``write``; ``print`` when none is)."""
        active = next((b for b in (self._bars["train"], self._bars["val"], self._bars["test"], self._bars["predict"])
                       if b is not None and not b.disable), None)
        if active is None:
            print(*args, sep=sep, **kwargs)
        else:
            active.write(sep.join(map(str, args)), **kwargs)


__all__ = ["ProgressBar", "TQDMProgressBar", "Tqdm"]
