"""Lightning's ``loggers.csv_logs`` path."""

from gpulayer.trainer.loggers import CSVLogger

__all__ = ["CSVLogger"]
