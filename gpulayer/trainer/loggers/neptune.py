"""``NeptuneLogger``: Neptune's service has shut down, so Lightning's logger for it only says where to go instead."""

from __future__ import annotations

from typing import Any


class NeptuneLogger:
    """Refuses to be created: Neptune has been sunset; ``LitLogger`` (or W&B, Comet, MLflow) takes its place."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("NeptuneLogger is no longer supported. Neptune has been sunset.\n\n"
                           "Please migrate to LitLogger (gpulayer.trainer.loggers.LitLogger), the recommended logger "
                           "for AI experiments: pip install litlogger\n"
                           "See: https://github.com/lightning-ai/litlogger\n")
