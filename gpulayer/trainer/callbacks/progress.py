"""Lightning's progress-bar callback names (``callbacks.progress``)."""

from __future__ import annotations

import warnings
from typing import Any

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.errors import TrainerConfigError


class TQDMProgressBar(Callback):
    """Lightning's progress-bar callback name: in ``callbacks`` it turns gpulayer's bar on (``refresh_rate=0``: off).

    gpulayer draws its own one-line bar from numbers already materialised at log
    intervals (``progress.py``); ``refresh_rate`` is accepted for compatibility and
    the bar redraws at most four times a second whatever it is.
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False):
        if not isinstance(refresh_rate, int) or refresh_rate < 0:
            raise TrainerConfigError(f"TQDMProgressBar(refresh_rate={refresh_rate!r}) must be an int >= 0")
        self.refresh_rate = refresh_rate
        self.process_position = process_position
        self.leave = leave
        self._trainer = None

    @property
    def trainer(self):
        """The trainer this bar belongs to (set in ``setup``, as Lightning's)."""
        if self._trainer is None:
            raise TypeError(f"The `{type(self).__name__}._trainer` reference has not been set yet.")
        return self._trainer

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._trainer = trainer

    def __getstate__(self) -> dict[str, Any]:
        # copies sent to the ranks of a multi-process fit leave this process's trainer behind
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


ProgressBar = TQDMProgressBar
RichProgressBar = TQDMProgressBar
