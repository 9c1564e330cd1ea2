"""Lightning's ``loggers.tensorboard`` path."""

from gpulayer.trainer.loggers import TensorBoardLogger

__all__ = ["TensorBoardLogger"]
