"""``Timer`` (Lightning's ``callbacks.timer``): measure each stage's time and stop training at a time limit.

``Trainer(max_time="00:12:00:00")`` is this callback with ``interval="step"``. The limit is checked when the
fit starts and after each training batch (``interval="step"``) or each training epoch (``"epoch"``); when it
is reached ``trainer.should_stop`` is set, so the fit ends as soon as ``min_epochs`` / ``min_steps`` allow.
Rank 0's clock decides for every rank. The training time elapsed is saved in checkpoints: a resumed fit
counts it against the same limit.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.states import RunningStage
from gpulayer.trainer.utilities.rank_zero import rank_zero_info

INTERVALS = ("step", "epoch")


def parse_duration(duration: str | timedelta | dict[str, int] | None) -> timedelta | None:
    """``"DD:HH:MM:SS"``, a ``timedelta`` or a dict of ``timedelta`` fields, as a ``timedelta``."""
    if isinstance(duration, str):
        found = re.fullmatch(r"(\d+):(\d\d):(\d\d):(\d\d)", duration.strip())
        if found is None:
            raise MisconfigurationException(
                f"`Timer(duration={duration!r})` is not a valid duration. Expected a string in the format DD:HH:MM:SS.")
        days, hours, minutes, seconds = (int(g) for g in found.groups())
        return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    if isinstance(duration, dict):
        return timedelta(**duration)
    return duration


class Timer(Callback):
    """``Timer(duration=None, interval="step", verbose=True)``: ``duration`` as ``parse_duration`` reads it.

    >>> timer = Timer(duration={"hours": 1})
    >>> timer.time_remaining()
    3600.0
    """

    def __init__(self, duration: str | timedelta | dict[str, int] | None = None, interval: str = "step",
                 verbose: bool = True) -> None:
        parsed = parse_duration(duration)
        if interval not in INTERVALS:
            raise MisconfigurationException(
                f"Unsupported parameter value `Timer(interval={interval})`. Possible choices are: {', '.join(INTERVALS)}")
        self._duration = parsed.total_seconds() if parsed is not None else None
        self._interval = interval
        self._verbose = verbose
        self._start_time: dict[RunningStage, float | None] = dict.fromkeys(RunningStage)
        self._end_time: dict[RunningStage, float | None] = dict.fromkeys(RunningStage)
        self._offset = 0.0  # training time of the fit this one resumed

    # -- times ------------------------------------------------------------------------------------
    def start_time(self, stage: str = RunningStage.TRAINING) -> float | None:
        return self._start_time[RunningStage(stage)]

    def end_time(self, stage: str = RunningStage.TRAINING) -> float | None:
        return self._end_time[RunningStage(stage)]

    def time_elapsed(self, stage: str = RunningStage.TRAINING) -> float:
        """Seconds spent in ``stage`` ("train", "validate", "test"); training includes the resumed fit's."""
        stage = RunningStage(stage)
        start, end = self._start_time[stage], self._end_time[stage]
        offset = self._offset if stage == RunningStage.TRAINING else 0
        if start is None:
            return offset
        return (time.monotonic() if end is None else end) - start + offset

    def time_remaining(self, stage: str = RunningStage.TRAINING) -> float | None:
        return self._duration - self.time_elapsed(stage) if self._duration is not None else None

    # -- hooks --------------------------------------------------------------------------------------
    def _mark(self, which: dict, stage: RunningStage) -> None:
        which[stage] = time.monotonic()

    def on_train_start(self, trainer, pl_module) -> None:
        self._mark(self._start_time, RunningStage.TRAINING)
        if self._offset and self._duration is not None:
            # gpulayer restores callback states after on_fit_start: a resumed, depleted timer stops here
            self._check_time_remaining(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self._mark(self._end_time, RunningStage.TRAINING)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._mark(self._start_time, RunningStage.VALIDATING)

    def on_validation_end(self, trainer, pl_module) -> None:
        self._mark(self._end_time, RunningStage.VALIDATING)

    def on_test_start(self, trainer, pl_module) -> None:
        self._mark(self._start_time, RunningStage.TESTING)

    def on_test_end(self, trainer, pl_module) -> None:
        self._mark(self._end_time, RunningStage.TESTING)

    def on_fit_start(self, trainer, *args: Any, **kwargs: Any) -> None:
        if self._duration is not None:
            self._check_time_remaining(trainer)

    def on_train_batch_end(self, trainer, *args: Any, **kwargs: Any) -> None:
        if self._interval == "step" and self._duration is not None:
            self._check_time_remaining(trainer)

    def on_train_epoch_end(self, trainer, *args: Any, **kwargs: Any) -> None:
        if self._interval == "epoch" and self._duration is not None:
            self._check_time_remaining(trainer)

    # -- state --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {stage.value: self.time_elapsed(stage) for stage in RunningStage}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = state_dict.get("time_elapsed", {}).get(RunningStage.TRAINING.value, 0)

    def _check_time_remaining(self, trainer) -> None:
        stop = self.time_elapsed() >= self._duration
        if trainer.world_size > 1:
            stop = trainer.strategy.broadcast_flag(stop)
        trainer.should_stop = trainer.should_stop or stop
        if stop and self._verbose:
            elapsed = timedelta(seconds=int(self.time_elapsed(RunningStage.TRAINING)))
            rank_zero_info(f"Time limit reached. Elapsed time is {elapsed}. Signaling Trainer to stop.")


__all__ = ["Timer", "parse_duration"]
