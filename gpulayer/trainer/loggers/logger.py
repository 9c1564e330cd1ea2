"""Lightning's ``loggers.logger`` path: the base class a custom logger subclasses."""

from gpulayer.trainer.loggers import Logger

__all__ = ["Logger"]
