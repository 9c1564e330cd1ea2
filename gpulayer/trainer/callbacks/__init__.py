"""Callbacks with Lightning's names and module paths (``lightning.pytorch.callbacks``).

``Callback``, ``ModelCheckpoint``, ``EarlyStopping``, ``LearningRateMonitor``, the fine-tuning
``BaseFinetuning`` / ``BackboneFinetuning``, ``BasePredictionWriter``, ``GradientAccumulationScheduler``,
``Timer``, the progress-bar name ``TQDMProgressBar``, and the weight callbacks ``ModelPruning``,
``StochasticWeightAveraging``, ``WeightAveraging`` / ``EMAWeightAveraging``. A callback overrides only the hooks it
needs; the Trainer never calls the others. Callbacks run on every rank; files
are written by global rank 0 only.
"""

from gpulayer.trainer.callbacks.batch_size_finder import BatchSizeFinder
from gpulayer.trainer.callbacks.callback import Callback, Checkpoint
from gpulayer.trainer.callbacks.device_stats_monitor import DeviceStatsMonitor
from gpulayer.trainer.callbacks.early_stopping import EarlyStopping
from gpulayer.trainer.callbacks.finetuning import BackboneFinetuning, BaseFinetuning
from gpulayer.trainer.callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler
from gpulayer.trainer.callbacks.lambda_function import LambdaCallback
from gpulayer.trainer.callbacks.lr_finder import LearningRateFinder
from gpulayer.trainer.callbacks.lr_monitor import LearningRateMonitor
from gpulayer.trainer.callbacks.model_checkpoint import ModelCheckpoint
from gpulayer.trainer.callbacks.prediction_writer import BasePredictionWriter
from gpulayer.trainer.callbacks.progress import ProgressBar, RichProgressBar, TQDMProgressBar
from gpulayer.trainer.callbacks.model_summary import ModelSummary
from gpulayer.trainer.callbacks.rich_model_summary import RichModelSummary
from gpulayer.trainer.callbacks.spike import SpikeDetection
from gpulayer.trainer.callbacks.throughput_monitor import ThroughputMonitor
from gpulayer.trainer.callbacks.pruning import ModelPruning
from gpulayer.trainer.callbacks.stochastic_weight_avg import StochasticWeightAveraging
from gpulayer.trainer.callbacks.timer import Timer
from gpulayer.trainer.callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging

__all__ = ["BackboneFinetuning", "BaseFinetuning", "BasePredictionWriter", "Callback", "Checkpoint", "DeviceStatsMonitor", "EarlyStopping",
           "GradientAccumulationScheduler", "LambdaCallback", "LearningRateMonitor", "ModelCheckpoint", "ModelSummary",
           "ProgressBar", "RichModelSummary", "RichProgressBar", "SpikeDetection", "ThroughputMonitor", "TQDMProgressBar", "Timer"]
__all__ += ["EMAWeightAveraging", "ModelPruning", "StochasticWeightAveraging", "WeightAveraging"]
__all__ += ["BatchSizeFinder", "LearningRateFinder"]
