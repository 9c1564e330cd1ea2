"""Callbacks with Lightning's names and module paths (``lightning.pytorch.callbacks``).

``Callback``, ``ModelCheckpoint``, ``EarlyStopping``, ``LearningRateMonitor``, the fine-tuning
``BaseFinetuning`` / ``BackboneFinetuning``, ``BasePredictionWriter``, ``GradientAccumulationScheduler``,
``Timer`` and the progress-bar name ``TQDMProgressBar``. A callback overrides only the hooks it
needs; the Trainer never calls the others. Callbacks run on every rank; files
are written by global rank 0 only.
"""

from gpulayer.trainer.callbacks.batch_size_finder import BatchSizeFinder
from gpulayer.trainer.callbacks.callback import Callback, Checkpoint
from gpulayer.trainer.callbacks.early_stopping import EarlyStopping
from gpulayer.trainer.callbacks.finetuning import BackboneFinetuning, BaseFinetuning
from gpulayer.trainer.callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler
from gpulayer.trainer.callbacks.lr_finder import LearningRateFinder
from gpulayer.trainer.callbacks.lr_monitor import LearningRateMonitor
from gpulayer.trainer.callbacks.model_checkpoint import ModelCheckpoint
from gpulayer.trainer.callbacks.prediction_writer import BasePredictionWriter
from gpulayer.trainer.callbacks.progress import ProgressBar, RichProgressBar, TQDMProgressBar
from gpulayer.trainer.callbacks.timer import Timer

__all__ = ["BackboneFinetuning", "BaseFinetuning", "BasePredictionWriter", "BatchSizeFinder", "Callback", "Checkpoint", "EarlyStopping",
           "GradientAccumulationScheduler", "LearningRateFinder", "LearningRateMonitor", "ModelCheckpoint", "ProgressBar",
           "RichProgressBar", "TQDMProgressBar", "Timer"]
