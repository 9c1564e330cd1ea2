"""Lightning's ``lightning.pytorch.core`` names."""

from gpulayer.trainer.core.optimizer import LightningOptimizer
from gpulayer.trainer.core.datamodule import LightningDataModule
from gpulayer.trainer.module import LightningModule

__all__ = ["LightningDataModule", "LightningModule", "LightningOptimizer"]
