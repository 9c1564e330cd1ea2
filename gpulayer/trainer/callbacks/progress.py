"""Lightning's progress-bar callback names (``callbacks.progress``)."""

from __future__ import annotations

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


ProgressBar = TQDMProgressBar
RichProgressBar = TQDMProgressBar
