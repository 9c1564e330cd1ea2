"""``ModelSummary``: the layer table of the module, printed by global rank 0 when a fit starts.

``Trainer(enable_model_summary=True)`` (the default) adds one with ``max_depth=1`` unless the callbacks hold one
already (a ``RichModelSummary`` when the progress bar is a ``RichProgressBar``). Subclasses change the output by
overriding the static ``summarize``, which receives the table's columns and the totals.
"""

from __future__ import annotations

import logging
from typing import Any

from gpulayer.trainer.callbacks.callback import Callback

log = logging.getLogger(__name__)


class ModelSummary(Callback):
    """Summarize the module's layers to ``max_depth`` (0: print nothing) at ``on_fit_start``.

    >>> Trainer(callbacks=[ModelSummary(max_depth=2)])     # doctest: +SKIP
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        self._max_depth: int = max_depth
        self._summarize_kwargs: dict[str, Any] = summarize_kwargs

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if not self._max_depth:
            return
        from gpulayer.trainer.utilities.model_summary import summarize

        summary = summarize(pl_module, max_depth=self._max_depth)
        data = summary._get_summary_data()
        if trainer.is_global_zero:
            self.summarize(data, summary.total_parameters, summary.trainable_parameters, summary.model_size,
                           summary.total_training_modes, total_flops=summary.total_flops, **self._summarize_kwargs)

    @staticmethod
    def summarize(summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int,
                  **summarize_kwargs: Any) -> None:
        """Emit the table: an INFO record of this module's logger, printed when no handler would show it."""
        from gpulayer.trainer.utilities.model_summary.model_summary import format_summary_table

        table = format_summary_table(summary_data, total_parameters, trainable_parameters, model_size,
                                     total_training_modes, total_flops)
        if log.isEnabledFor(logging.INFO) and log.hasHandlers():
            log.info("\n" + table)
        else:  # gpulayer configures no logging handler; the summary is shown on stdout as it always was
            print(table)
